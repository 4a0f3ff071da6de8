package presence_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/presence"
	"roomcast/proto/clientpb"
)

// Each ChatLink publishes its session events on its own 100 ms clock, so a user's newer login
// on one node can reach presence before the older login on another. The policy still holds:
// when the older login arrives, it is the one closed. (Before, a login only closed sessions
// older than itself, and two web sessions stayed.)
func TestDevicePolicyLoginsOutOfOrder(t *testing.T) {
	t.Parallel()
	ns := testkit.NATS(t)
	s, err := presence.New(presence.Config{
		Bus: testkit.Connect(t, ns), Log: slog.New(slog.DiscardHandler),
		Policies: map[string]presence.DevicePolicy{"a": {OnePerDevice: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	nc := testkit.Connect(t, ns)
	kicks := make(chan *buspb.NodeControl, 8)
	for _, node := range []string{"n1", "n2"} {
		if _, err := nc.Subscribe(bus.NodeSubject(node), func(m *nats.Msg) {
			var c buspb.NodeControl
			if proto.Unmarshal(m.Data, &c) == nil && c.Op == buspb.NodeControl_OP_KICK {
				c.Reason = m.Subject + ": " + c.Reason
				kicks <- &c
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	login := func(node, session string, at int64) {
		t.Helper()
		b, _ := proto.Marshal(&buspb.SessionEvents{Node: node, Boot: "b", Seq: 1, Events: []*buspb.SessionEvent{{
			Kind: buspb.SessionEvent_KIND_LOGIN, App: "a", Uid: "ann", Room: "r", Node: node, SessionId: session, Device: "web", TimeMs: at,
		}}})
		if err := nc.Publish(bus.SubjectPresenceEvents, b); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	login("n2", "new", 2000) // the newer login's batch first
	time.Sleep(100 * time.Millisecond)
	login("n1", "old", 1000)

	select {
	case k := <-kicks:
		if len(k.Sessions) != 1 || k.Sessions[0] != "old" || k.CloseCode != uint32(clientpb.CloseCode_CLOSE_CODE_REPLACED) {
			t.Fatalf("kick %v, want session old closed with %d", k, clientpb.CloseCode_CLOSE_CODE_REPLACED)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no session closed: two web sessions stay")
	}
	select {
	case k := <-kicks:
		t.Fatalf("a second kick: %v", k)
	case <-time.After(200 * time.Millisecond):
	}
}
