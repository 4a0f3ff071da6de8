package chatlink_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// sendRequests counts the members' send requests a cluster's ChatLinks put on the bus for a
// room (a plain subscription sees every message of the room service's queue group), and the
// sends they carry.
type sendRequests struct {
	requests, sends atomic.Int64
}

func countSendRequests(t *testing.T, c *devcluster.Cluster, room string) *sendRequests {
	t.Helper()
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var n sendRequests
	count := func(sends []*buspb.SendRequest) {
		if len(sends) > 0 && sends[0].Room == room && sends[0].SessionId != "" {
			n.requests.Add(1)
			n.sends.Add(int64(len(sends)))
		}
	}
	if _, err := nc.Subscribe(bus.SubjectRoomSend, func(m *nats.Msg) {
		var req buspb.SendRequest
		if proto.Unmarshal(m.Data, &req) == nil {
			count([]*buspb.SendRequest{&req})
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(bus.SubjectRoomSendBatch, func(m *nats.Msg) {
		var req buspb.SendBatchRequest
		if proto.Unmarshal(m.Data, &req) == nil {
			count(req.Sends)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// answers reads a sender's answers to sends 1..n (skipping Pushes) and returns them by seq;
// a second answer to one send, or one to a send it did not make, fails the test.
func answers(t *testing.T, cl *testkit.Client, n int) map[uint64]*clientpb.Frame {
	t.Helper()
	got := map[uint64]*clientpb.Frame{}
	for len(got) < n {
		f := cl.Next()
		var seq uint64
		switch {
		case f.GetPush() != nil:
			continue
		case f.GetSendAck() != nil:
			seq = f.GetSendAck().Seq
		case f.GetError() != nil:
			seq = f.GetError().Seq
		default:
			t.Fatalf("unexpected frame %v", f)
		}
		if seq < 1 || seq > uint64(n) || got[seq] != nil {
			t.Fatalf("answer to send %d: a second answer, or to a send never made (%v)", seq, f)
		}
		got[seq] = f
	}
	return got
}

// Many members' sends on one node in a few windows go to the room service as one request per
// room and window (20 ms), not one each; every send gets its SendAck with its own message id,
// and a viewer receives every message.
func TestUploadsBatchedPerWindow(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	const room, members, each = "danmaku", 40, 5
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"normal_budget":-1,"bulk_per_second":-1}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	addr := c.Nodes[0].TCPAddr()
	viewer := testkit.DialTCP(t, addr)
	viewer.Login(testcluster.Token(t, "viewer", room))
	senders := make([]*testkit.Client, members)
	for i := range senders {
		senders[i] = testkit.DialTCP(t, addr)
		senders[i].Login(testcluster.Token(t, fmt.Sprintf("m%d", i), room))
	}
	n := countSendRequests(t, c, room)
	start := time.Now()
	for i, cl := range senders {
		for j := range each {
			cl.Send(sendFrame(uint64(j+1), fmt.Sprintf("%d-%d", i, j)))
		}
	}
	ids := map[string]bool{}
	for _, cl := range senders {
		for seq, f := range answers(t, cl, each) {
			ack := f.GetSendAck()
			if ack == nil || ack.MessageId == "" || ids[ack.MessageId] {
				t.Fatalf("send %d: want a SendAck with a message id of its own, got %v", seq, f)
			}
			ids[ack.MessageId] = true
		}
	}
	elapsed := time.Since(start)
	msgs, _ := viewer.CollectPushes(members * each)
	if len(msgs) != members*each {
		t.Fatalf("viewer got %d messages, want %d", len(msgs), members*each)
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if got := n.sends.Load(); got != members*each {
			return fmt.Errorf("bus carried %d sends, want %d", got, members*each)
		}
		return nil
	})
	windows := int64(elapsed/chatlink.DefaultSendWindow) + 1
	t.Logf("%d sends in %v: %d requests to the room service (%d windows)", members*each, elapsed, n.requests.Load(), windows)
	if got := n.requests.Load(); got > windows || got > members*each/10 {
		t.Errorf("%d requests to the room service for %d sends in %v; want at most one per window (%d) and a tenth of the sends",
			got, members*each, elapsed, windows)
	}
}

// A window's sends are checked and answered each on its own, in one request: a muted member's
// refused as soon as the mute is set, a member's critical one refused for its lane, the room's
// cap on its members' sends (kept by the room service over the sends of every node) refusing
// what passes it, and the rest acknowledged.
func TestUploadBatchAnswersEach(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.Room.MemberSendsPerSecond = 10 // bursts of 20
	})
	const room = "checked"
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey, `{"room":"`+room+`"}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	dial := func(node int, uid string) *testkit.Client {
		cl := testkit.DialTCP(t, c.Nodes[node].TCPAddr())
		cl.Login(testcluster.Token(t, uid, room))
		return cl
	}
	muted, plain := dial(0, "muted"), dial(0, "plain")
	plain.Send(sendFrame(1, "before the mute"))
	if f := answers(t, plain, 1)[1]; f.GetSendAck() == nil {
		t.Fatalf("want a SendAck, got %v", f)
	}
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/members/muted/mute", devcluster.APIKey, `{}`, nil); code != http.StatusOK {
		t.Fatalf("mute: HTTP %d", code)
	}
	// The mute applies to the next send after the room service has seen it: within a moment.
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		muted.Send(sendFrame(1, "muted"))
		if e := answers(t, muted, 1)[1].GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN) {
			return fmt.Errorf("the muted member's send was not refused: %v", e)
		}
		return nil
	})

	n := countSendRequests(t, c, room)
	// One window of each node: the muted member's send, a critical send, and 40 plain sends
	// over both nodes, of which the room's cap (a burst of 20, less the one before) takes 19.
	var others []*testkit.Client
	for i := range 8 {
		others = append(others, dial(i%2, fmt.Sprintf("o%d", i)))
	}
	const plainRoomSends = 1 // the cap's tokens already taken: the plain send before the mute
	muted.Send(sendFrame(1, "still muted"))
	plain.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 1, Type: "chat", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("critical")}}})
	for _, cl := range others {
		for j := range 5 {
			cl.Send(sendFrame(uint64(j+1), "o"))
		}
	}
	if e := answers(t, muted, 1)[1].GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN) {
		t.Errorf("muted member: want Error FORBIDDEN, got %v", e)
	}
	if e := answers(t, plain, 1)[1].GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED) {
		t.Errorf("member's critical send: want Error LANE_NOT_ALLOWED, got %v", e)
	}
	var mu sync.Mutex
	acked, limited := 0, 0
	for _, cl := range others {
		for _, f := range answers(t, cl, 5) {
			mu.Lock()
			switch e := f.GetError(); {
			case f.GetSendAck() != nil:
				acked++
			case e != nil && e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) && e.RetryAfterMs > 0:
				limited++
			default:
				t.Errorf("want a SendAck or Error SEND_RATE_LIMITED with a retry hint, got %v", f)
			}
			mu.Unlock()
		}
	}
	// The bucket refills at 10 a second while the test runs, and the muted member's sends that
	// came before the mute took effect took from it: the cap is kept, not to the send.
	if acked < 10 || acked > 20-plainRoomSends+5 || acked+limited != 40 {
		t.Errorf("%d acknowledged and %d refused for the room's rate, want about %d and the rest", acked, limited, 20-plainRoomSends)
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if got := n.sends.Load(); got != 42 {
			return fmt.Errorf("bus carried %d sends, want 42", got)
		}
		return nil
	})
	if got := n.requests.Load(); got > 10 {
		t.Errorf("%d requests to the room service for 42 sends from two nodes, want a few (one per node and window)", got)
	}
}

// Every send gets exactly one answer when the room service does not answer in time (a slow
// one) or not at all (none listening): 503, and nothing later.
func TestUploadAnsweredWhenRoomServiceFails(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.RequestTimeout = 300 * time.Millisecond
	})
	const room = "slow"
	cl := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	cl.Login(testcluster.Token(t, "member", room))
	other := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	other.Login(testcluster.Token(t, "other", room))

	// A slow room service: a responder in the room service's queue group that answers after
	// the ChatLink gave up. The real instances are stopped first, so it takes every request.
	for _, r := range c.Rooms {
		r.Close()
	}
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var got atomic.Int64
	sub, err := nc.QueueSubscribe(bus.SubjectRoomSendBatch, "room", func(m *nats.Msg) {
		got.Add(1)
		time.Sleep(600 * time.Millisecond)
		var req buspb.SendBatchRequest
		_ = proto.Unmarshal(m.Data, &req)
		rep := &buspb.Reply{Answers: make([]*buspb.Reply, len(req.Sends))}
		for i := range rep.Answers {
			rep.Answers[i] = &buspb.Reply{MessageId: "late"}
		}
		b, _ := proto.Marshal(rep)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	check := func(what string, from ...*testkit.Client) {
		t.Helper()
		for _, s := range from {
			for seq := range 3 {
				s.Send(sendFrame(uint64(seq+1), what))
			}
		}
		for _, s := range from {
			for seq, f := range answers(t, s, 3) {
				if e := f.GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE) {
					t.Errorf("%s: send %d: want Error UNAVAILABLE, got %v", what, seq, f)
				}
			}
			s.ExpectSilence(400 * time.Millisecond) // the late answer is not passed on
		}
	}
	check("slow", cl, other)
	if got.Load() == 0 {
		t.Fatal("the slow responder got no request")
	}
	// No room service at all: the request fails at once.
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	check("none", cl, other)
}
