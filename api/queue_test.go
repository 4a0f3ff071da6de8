package api_test

import (
	"encoding/base64"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// TestQueueCalls drives a room's queue through every call over HTTP and gRPC, checks the
// errors, and checks that a member in the room receives each change as an rc.queue message.
func TestQueueCalls(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	watcher, _ := member(t, c.Nodes[0].TCPAddr(), "watcher", "q1")
	g := grpcClient(t, c)
	ctx := devCtx()

	// Offer over HTTP (value in base64) and gRPC; order is the offer order.
	out := mustHTTP(t, c, 200, "POST", "/v1/rooms/q1/queue", `{"key":"first","value":"`+base64.StdEncoding.EncodeToString([]byte("hello"))+`","uid":"ann"}`)
	if e := out["entries"].([]any)[0].(map[string]any); e["key"] != "first" || e["uid"] != "ann" || e["value"] != "aGVsbG8=" || out["version"].(float64) != 1 {
		t.Fatalf("HTTP offer answered %v", out)
	}
	if r, err := g.OfferQueue(ctx, &roompb.QueueRequest{Room: "q1", Key: "second", Value: []byte("v2")}); err != nil || r.Version != 2 {
		t.Fatalf("gRPC offer: %v %v", r, err)
	}
	mustHTTP(t, c, 200, "POST", "/v1/rooms/q1/queue", `{"key":"third"}`)
	// A taken key with if_absent: 409 QUEUE_KEY_EXISTS over HTTP, AlreadyExists over gRPC.
	if out := mustHTTP(t, c, 409, "POST", "/v1/rooms/q1/queue", `{"key":"first","if_absent":true}`); out["name"] != "QUEUE_KEY_EXISTS" || out["code"].(float64) != 114 {
		t.Fatalf("offer of a taken key answered %v", out)
	}
	if _, err := g.OfferQueue(ctx, &roompb.QueueRequest{Room: "q1", Key: "first", IfAbsent: true}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("gRPC offer of a taken key: %v", err)
	}
	// Bad input.
	for _, bad := range []struct{ body, name string }{
		{`{"key":""}`, "BAD_REQUEST"},
		{`{"key":"sp ace"}`, "BAD_REQUEST"},
		{`{"key":"k","drop_on_leave":true}`, "BAD_REQUEST"},
		{`{"key":"k","value":"` + base64.StdEncoding.EncodeToString(make([]byte, 1025)) + `"}`, "MESSAGE_TOO_LARGE"},
	} {
		if status, out := httpCall(t, c, "POST", "/v1/rooms/q1/queue", devcluster.APIKey, bad.body); status/100 != 4 || out["name"] != bad.name {
			t.Errorf("offer %s answered HTTP %d %v, want %s", bad.body, status, out, bad.name)
		}
	}

	list := mustHTTP(t, c, 200, "GET", "/v1/rooms/q1/queue", "")
	if got := keysOf(list); len(got) != 3 || got[0] != "first" || got[1] != "second" || got[2] != "third" || list["version"].(float64) != 3 {
		t.Fatalf("list answered %v", list)
	}
	if out := mustHTTP(t, c, 200, "GET", "/v1/rooms/q1/queue/head", ""); keysOf(out)[0] != "first" {
		t.Fatalf("peek answered %v", out)
	}
	if out := mustHTTP(t, c, 200, "GET", "/v1/rooms/q1/queue/head?key=third", ""); keysOf(out)[0] != "third" {
		t.Fatalf("peek of a key answered %v", out)
	}
	if out := mustHTTP(t, c, 200, "POST", "/v1/rooms/q1/queue/poll", ""); keysOf(out)[0] != "first" {
		t.Fatalf("poll answered %v", out)
	}
	if r, err := g.RemoveQueueEntry(ctx, &roompb.QueueRequest{Room: "q1", Key: "third"}); err != nil || r.Entries[0].Key != "third" {
		t.Fatalf("gRPC remove: %v %v", r, err)
	}
	if out := mustHTTP(t, c, 404, "DELETE", "/v1/rooms/q1/queue/third", ""); out["name"] != "QUEUE_NOT_FOUND" {
		t.Fatalf("remove of a key not there answered %v", out)
	}
	if r, err := g.PeekQueue(ctx, &roompb.QueueRequest{Room: "q1"}); err != nil || r.Entries[0].Key != "second" {
		t.Fatalf("gRPC peek: %v %v", r, err)
	}
	if out := mustHTTP(t, c, 200, "DELETE", "/v1/rooms/q1/queue", ""); keysOf(out)[0] != "second" || out["version"].(float64) != 6 {
		t.Fatalf("clear answered %v", out)
	}
	if r, err := g.ListQueue(ctx, &roompb.QueueRequest{Room: "q1"}); err != nil || len(r.Entries) != 0 || r.Version != 6 {
		t.Fatalf("gRPC list after clear: %v %v", r, err)
	}
	if _, err := g.PollQueue(ctx, &roompb.QueueRequest{Room: "q1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("gRPC poll of an empty queue: %v", err)
	}

	// The member saw the six changes, in order, as critical rc.queue messages from the app.
	var ops []clientpb.QueueOp
	deadline := time.Now().Add(5 * time.Second)
	for len(ops) < 6 && time.Now().Before(deadline) {
		f := watcher.NextWithin(time.Until(deadline))
		for _, m := range f.GetPush().GetMessages() {
			var ev clientpb.QueueEvent
			if m.Type != "rc.queue" || m.Lane != clientpb.Lane_LANE_CRITICAL || m.Sender != "" || proto.Unmarshal(m.Body, &ev) != nil {
				t.Fatalf("unexpected message %v", m)
			}
			if ev.Version != uint64(len(ops)+1) {
				t.Fatalf("event version %d, want %d", ev.Version, len(ops)+1)
			}
			ops = append(ops, ev.Op)
		}
	}
	want := []clientpb.QueueOp{clientpb.QueueOp_QUEUE_OP_OFFER, clientpb.QueueOp_QUEUE_OP_OFFER, clientpb.QueueOp_QUEUE_OP_OFFER, clientpb.QueueOp_QUEUE_OP_POLL, clientpb.QueueOp_QUEUE_OP_REMOVE, clientpb.QueueOp_QUEUE_OP_CLEAR}
	if len(ops) != len(want) {
		t.Fatalf("the member saw %v, want %v", ops, want)
	}
	for i := range want {
		if ops[i] != want[i] {
			t.Fatalf("the member saw %v, want %v", ops, want)
		}
	}
}

func keysOf(out map[string]any) []string {
	var keys []string
	for _, e := range out["entries"].([]any) {
		keys = append(keys, e.(map[string]any)["key"].(string))
	}
	return keys
}
