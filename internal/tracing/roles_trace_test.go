package tracing_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/dispatcherpb"
	"roomcast/proto/segment"
)

// TestRoleSpans: with tracing on, the roles beyond the send path record their spans in the
// right traces, the context crossing NATS in headers: a dispatch call over HTTP and over gRPC
// is a dispatcher span in its caller's trace; a login's trace goes on from the ChatLink's login
// span through the session events' publish to presence's spans (and the app's online event
// carries it); a bulk message of a room in CDN mode goes from the room service's batch publish
// to the pusher's batch and the write of its segment.
func TestRoleSpans(t *testing.T) {
	col, stop := startCollector(t)
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.CDN.Tick = 50 * time.Millisecond })
	const app, room = devcluster.App, "stage"

	// Dispatch calls in their callers' traces.
	const httpTrace, grpcTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodGet, c.URL()+"/v1/dispatch?app="+app+"&room="+room, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", "00-"+httpTrace+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/dispatch: HTTP %d", resp.StatusCode)
	}
	conn, err := grpc.NewClient(c.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+grpcTrace+"-"+callerSpan+"-01")
	if _, err := dispatcherpb.NewDispatcherClient(conn).Dispatch(ctx, &dispatcherpb.DispatchRequest{App: app, Room: room}); err != nil {
		t.Fatalf("gRPC Dispatch: %v", err)
	}

	// A login, and its online event as an app backend gets it.
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events, err := nc.SubscribeSync(bus.AppEventsSubject(app))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cl := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	defer cl.Close()
	cl.Login(testcluster.Token(t, "alice", room))
	var online *nats.Msg
	for online == nil {
		msg, err := events.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("alice's online event: %v", err)
		}
		var evs buspb.SessionEvents
		if err := proto.Unmarshal(msg.Data, &evs); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Events {
			if ev.Uid == "alice" && ev.Kind == buspb.SessionEvent_KIND_LOGIN {
				online = msg
			}
		}
	}
	testcluster.WaitOnline(t, c, "alice")

	// A bulk message of the room in CDN mode, until its segment is stored.
	testcluster.Call(t, c, http.MethodPut, "/v1/rooms/"+room+"/cdn", devcluster.APIKey, `{"mode":"CDN_MODE_BULK"}`, nil)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		var rc struct{ Mode, Pusher string }
		testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/cdn", devcluster.APIKey, "", &rc)
		if rc.Mode != "CDN_MODE_BULK" || rc.Pusher == "" {
			return fmt.Errorf("room's CDN state %+v, want bulk with a pusher", rc)
		}
		return nil
	})
	// The room service follows the route a moment after the API shows it: a message sent before
	// that rides the long connections, and its window's segment is an empty one. So send until
	// a segment holds one.
	stored := false
	for try := 0; !stored; try++ {
		if try == 5 {
			t.Fatal("no bulk message reached a segment in 5 tries")
		}
		var sent struct {
			ID           string `json:"id"`
			ServerTimeMs int64  `json:"server_time_ms"`
		}
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages", devcluster.APIKey, `{"body":"to the CDN","lane":"bulk"}`, &sent); code != http.StatusOK {
			t.Fatalf("send: HTTP %d", code)
		}
		stored = segmentHolds(t, c, room, sent.ServerTimeMs, sent.ID)
	}
	// Every span has ended once the cluster is closed (a segment is visible in S3 a moment
	// before its write's span ends).
	c.Close()
	stop() // sends the buffered spans
	id := func(b []byte) string { return hex.EncodeToString(b) }
	byTrace := map[string]*tracepb.Span{}
	for _, s := range col.byName("dispatcher dispatch") {
		byTrace[id(s.TraceId)] = s
	}
	for _, tr := range []string{httpTrace, grpcTrace} {
		s := byTrace[tr]
		if s == nil || id(s.ParentSpanId) != callerSpan || s.Kind != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("dispatcher dispatch in the caller's trace %s: %v", tr, s)
		}
	}

	login := col.one(t, "chatlink login")
	publish := col.one(t, "chatlink session events publish")
	if string(publish.TraceId) != string(login.TraceId) || string(publish.ParentSpanId) != string(login.SpanId) {
		t.Fatalf("session events publish in trace %x under %x, want the login's %x under %x", publish.TraceId, publish.ParentSpanId, login.TraceId, login.SpanId)
	}
	for _, name := range []string{"presence apply", "presence effects"} {
		s := col.one(t, name)
		if string(s.TraceId) != string(login.TraceId) || string(s.ParentSpanId) != string(publish.SpanId) || s.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("%s in trace %x under %x (%v), want the login's trace under the publish %x", name, s.TraceId, s.ParentSpanId, s.Kind, publish.SpanId)
		}
	}
	if tp := online.Header.Get("traceparent"); tp == "" || tp[3:35] != id(login.TraceId) {
		t.Errorf("the app's online event carries traceparent %q, want one of the login's trace %x", tp, login.TraceId)
	}

	spans := map[string]*tracepb.Span{} // by span id
	for _, name := range []string{"room batch publish", "cdn pusher batch"} {
		for _, s := range col.byName(name) {
			spans[id(s.SpanId)] = s
		}
	}
	found := false
	for _, write := range col.byName("cdn segment write") {
		batch := spans[id(write.ParentSpanId)]
		if batch == nil || batch.Name != "cdn pusher batch" {
			continue
		}
		if pub := spans[id(batch.ParentSpanId)]; pub != nil && pub.Name == "room batch publish" && string(pub.TraceId) == string(write.TraceId) {
			found = true
		}
	}
	if !found {
		t.Error("no cdn segment write under a cdn pusher batch under a room batch publish, in one trace")
	}
}

// segmentHolds waits for the segment of the window of timeMs of room and reports whether it
// holds the message id.
func segmentHolds(t *testing.T, c *devcluster.Cluster, room string, timeMs int64, id string) bool {
	t.Helper()
	const windowMs = 1000 // the dev cluster's
	index := segment.Index(timeMs, windowMs)
	url := segment.URL(c.CDNOrigin()+"/{app}/{room}/{window_ms}/{index}", devcluster.App, room, windowMs, index)
	var seg *clientpb.Segment
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("segment %s: HTTP %d", url, resp.StatusCode)
		}
		seg, err = segment.Decode(body, segment.Want{App: devcluster.App, Room: room, WindowMs: windowMs, Index: index})
		return err
	})
	for _, m := range seg.Messages {
		if m.Id == id {
			return true
		}
	}
	return false
}
