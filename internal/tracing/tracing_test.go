package tracing_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/internal/tracing"
	"roomcast/proto/clientpb"
)

// collector is a test OTLP/HTTP collector: it decodes the protobuf export requests it is sent
// and keeps their spans.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want protobuf on /v1/traces", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// startCollector starts a test collector and turns tracing on, every trace sampled, exporting
// to it. stop sends the spans still buffered and turns tracing off; it is also called at the
// test's end.
func startCollector(t *testing.T) (col *collector, stop func()) {
	col = &collector{}
	srv := httptest.NewServer(col)
	t.Cleanup(srv.Close)
	shutdown, err := tracing.Setup(tracing.Config{Endpoint: srv.URL, SampleRatio: 1, Service: "roomcast-test"})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return col, stop
}

// one returns the one span called name.
func (c *collector) one(t *testing.T, name string) *tracepb.Span {
	t.Helper()
	s := c.byName(name)
	if len(s) != 1 {
		t.Fatalf("%d spans called %q, want 1", len(s), name)
	}
	return s[0]
}

// byName returns the spans called name.
func (c *collector) byName(name string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// TestChatMessageTrace sends one chat message through a ChatLink of a real in-process cluster
// with tracing exported to a test collector, and checks that the message's spans from the
// ChatLink, the bus and the room service form one trace: chatlink send → bus request → room send;
// and that a server API call joins the trace its caller's traceparent names.
func TestChatMessageTrace(t *testing.T) {
	col, stop := startCollector(t)

	c := testcluster.Start(t)
	cl := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	defer cl.Close()
	cl.Login(testcluster.Token(t, "alice", "r1"))
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 1, Body: []byte("hi")}}})
	for {
		f := cl.NextWithin(5 * time.Second)
		if f == nil {
			t.Fatal("no SendAck")
		}
		if ack := f.GetSendAck(); ack != nil {
			break
		}
		if e := f.GetError(); e != nil {
			t.Fatalf("send refused: %v", e)
		}
	}
	// An app server's call to the server API, in the app's trace: the API's span is under the
	// caller's, and the room service's under the API's bus request.
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, c.URL()+"/v1/rooms/r1/messages", strings.NewReader(`{"body":"from the app"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("SendToRoom: HTTP %d", resp.StatusCode)
	}
	// Both messages have left the room service (and its batch window) once alice has the last.
	for delivered := false; !delivered; {
		f := cl.NextWithin(5 * time.Second)
		if f == nil {
			t.Fatal("the app's message did not reach alice")
		}
		for _, m := range f.GetPush().GetMessages() {
			delivered = delivered || string(m.Body) == "from the app"
		}
	}

	stop() // sends the buffered spans
	one := func(name string) *tracepb.Span { return col.one(t, name) }
	apiSpan := one("POST /v1/rooms/{room}/messages")
	if hex.EncodeToString(apiSpan.TraceId) != callerTrace || hex.EncodeToString(apiSpan.ParentSpanId) != callerSpan {
		t.Fatalf("API span in trace %x under %x, want the caller's %s under %s", apiSpan.TraceId, apiSpan.ParentSpanId, callerTrace, callerSpan)
	}
	var send, room *tracepb.Span
	send = one("chatlink send")
	apiRoom := false // the API's send reached the room service in the caller's trace
	for _, s := range col.byName("room send") {
		if string(s.TraceId) == string(send.TraceId) {
			room = s
		} else if hex.EncodeToString(s.TraceId) != callerTrace {
			t.Errorf("room send in trace %x, neither the chat message's nor the API call's", s.TraceId)
		} else {
			apiRoom = true
		}
	}
	if room == nil {
		t.Fatal("no room send span in the chat message's trace")
	}
	if !apiRoom {
		t.Error("no room send span in the API caller's trace")
	}
	var busReq *tracepb.Span
	for _, s := range col.byName("bus request") {
		if string(s.ParentSpanId) == string(send.SpanId) {
			busReq = s
		}
	}
	if busReq == nil {
		t.Fatal("no bus request span under the chatlink send span")
	}
	for _, s := range []*tracepb.Span{busReq, room} {
		if fmt.Sprintf("%x", s.TraceId) != fmt.Sprintf("%x", send.TraceId) {
			t.Fatalf("span %q is in trace %x, the chatlink send in %x", s.Name, s.TraceId, send.TraceId)
		}
	}
	if string(room.ParentSpanId) != string(busReq.SpanId) {
		t.Fatalf("room send's parent is %x, want the bus request %x", room.ParentSpanId, busReq.SpanId)
	}
	linked := false // the batch the message left in links to its room send
	for _, pub := range col.byName("room batch publish") {
		for _, l := range pub.Links {
			linked = linked || (string(l.TraceId) == string(room.TraceId) && string(l.SpanId) == string(room.SpanId))
		}
	}
	if !linked {
		t.Error("no room batch publish span links to the message's room send")
	}
	if len(send.ParentSpanId) != 0 {
		t.Fatalf("chatlink send has parent %x, want a new trace", send.ParentSpanId)
	}
	kinds := map[string]tracepb.Span_SpanKind{"chatlink send": send.Kind, "bus request": busReq.Kind, "room send": room.Kind}
	want := map[string]tracepb.Span_SpanKind{"chatlink send": tracepb.Span_SPAN_KIND_SERVER, "bus request": tracepb.Span_SPAN_KIND_CLIENT, "room send": tracepb.Span_SPAN_KIND_SERVER}
	for name, k := range want {
		if kinds[name] != k {
			t.Errorf("%s is a %v span, want %v", name, kinds[name], k)
		}
	}
	if len(col.byName("chatlink login")) != 1 || len(col.byName("room join")) != 1 {
		t.Errorf("login spans: %d chatlink login, %d room join, want 1 each", len(col.byName("chatlink login")), len(col.byName("room join")))
	}
}

func TestSetupRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []tracing.Config{
		{Endpoint: "collector:4318", SampleRatio: 1},
		{Endpoint: "http://collector:4318", SampleRatio: 1.5},
	} {
		if _, err := tracing.Setup(cfg); err == nil {
			t.Errorf("Setup(%+v) = nil error, want a refusal", cfg)
		}
	}
}

// While tracing is off, starting and ending a span allocates nothing: the send path pays
// nothing for tracing it has not turned on.
func TestStartOffAllocatesNothing(t *testing.T) {
	if tracing.Enabled() {
		t.Fatal("tracing was left on by an earlier test in this process")
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		_, span := tracing.Start(ctx, "chatlink send", trace.SpanKindServer)
		span.End()
	}); n != 0 {
		t.Fatalf("Start with tracing off: %v allocations, want 0", n)
	}
	// Nor does a consumer's span of a bus message that carries a trace context (presence's
	// session events, a pusher's batch).
	msg := &nats.Msg{Subject: "rc.sessions.events", Header: nats.Header{"traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}
	if n := testing.AllocsPerRun(1000, func() {
		_, span := bus.StartConsumer(msg, "presence apply")
		span.End()
	}); n != 0 {
		t.Fatalf("StartConsumer with tracing off: %v allocations, want 0", n)
	}
}
