package chatlink_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// withClock runs every ChatLink of a cluster on clock (Config.Now).
func withClock(clock *testkit.Clock) testcluster.Option {
	return func(cfg *devcluster.Config) {
		cfg.ChatLink.Now = clock.Now
	}
}

func sendFrame(seq uint64, body string) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: seq, Type: "chat", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(body)}}}
}

// roomSubscribers returns the names of the NATS connections subscribed to a room's subject.
func roomSubscribers(t *testing.T, s *server.Server, room string) map[string]bool {
	t.Helper()
	cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, ci := range cz.Conns {
		for _, sub := range ci.Subs {
			if sub == "rc.room."+devcluster.App+"."+room {
				out[ci.Name] = true
			}
		}
	}
	return out
}

func TestCrossNodeDelivery(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	n1, n2 := c.Nodes[0], c.Nodes[1]

	alice := testkit.DialWS(t, n1.WSURL())
	aliceAck := alice.Login(testcluster.Token(t, "alice", "r1"))
	bob := testkit.DialTCP(t, n2.TCPAddr())
	bob.Login(testcluster.Token(t, "bob", "r1"))
	carol := testkit.DialWS(t, n1.WSURL())
	carol.Login(testcluster.Token(t, "carol", "r1"))
	dave := testkit.DialWS(t, n2.WSURL()) // another room on node 2
	dave.Login(testcluster.Token(t, "dave", "r2"))
	if aliceAck.Node != "cl-1" || !strings.HasPrefix(aliceAck.SessionId, "cl-1-") {
		t.Fatalf("login ack names node %q, session %q", aliceAck.Node, aliceAck.SessionId)
	}

	alice.Send(sendFrame(7, "hello from node 1"))
	ack := alice.Next().GetSendAck()
	if ack == nil || ack.Seq != 7 || len(ack.MessageId) != 26 {
		t.Fatalf("want SendAck for seq 7 with a message id, got %v", ack)
	}
	for _, who := range []*testkit.Client{bob, carol} {
		msgs := who.Next().GetPush().GetMessages()
		if len(msgs) != 1 || string(msgs[0].Body) != "hello from node 1" || msgs[0].Sender != "alice" || msgs[0].Id != ack.MessageId {
			t.Fatalf("want alice's message, got %v", msgs)
		}
	}
	alice.ExpectSilence(200 * time.Millisecond) // no echo to the sender
	dave.ExpectSilence(0)

	bob.Send(sendFrame(1, "hello from node 2"))
	if bob.Next().GetSendAck() == nil {
		t.Fatal("bob's send not acknowledged")
	}
	for _, who := range []*testkit.Client{alice, carol} {
		if msgs := who.Next().GetPush().GetMessages(); len(msgs) != 1 || msgs[0].Sender != "bob" {
			t.Fatalf("want bob's message, got %v", msgs)
		}
	}
	dave.ExpectSilence(100 * time.Millisecond)

	// Room r2 has members only on node 2: node 1 has no interest in it, so NATS sends it nothing.
	subs := roomSubscribers(t, c.NATS, "r2")
	if !subs["chatlink cl-2"] || subs["chatlink cl-1"] {
		t.Fatalf("subscribers of r2: %v, want only chatlink cl-2", subs)
	}
	// When its last member leaves, a node drops the room's subscription.
	dave.Close()
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if subs := roomSubscribers(t, c.NATS, "r2"); len(subs) != 0 {
			return fmt.Errorf("r2 still has subscribers %v", subs)
		}
		return nil
	})
}

func TestServerAPISendReachesBothNodes(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	a := testkit.DialWS(t, c.Nodes[0].WSURL())
	a.Login(testcluster.Token(t, "a", "lobby"))
	b := testkit.DialWS(t, c.Nodes[1].WSURL())
	b.Login(testcluster.Token(t, "b", "lobby"))

	req, _ := http.NewRequest("POST", c.URL()+"/v1/rooms/lobby/messages", strings.NewReader(`{"type":"notice","lane":"critical","body":"doors open"}`))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("send: HTTP %d", resp.StatusCode)
	}
	for _, who := range []*testkit.Client{a, b} {
		msgs := who.Next().GetPush().GetMessages()
		if len(msgs) != 1 || string(msgs[0].Body) != "doors open" || msgs[0].Lane != clientpb.Lane_LANE_CRITICAL || msgs[0].Sender != "" {
			t.Fatalf("want the notice, got %v", msgs)
		}
	}
}

func TestPipelinedSendsKeepOrder(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2), testcluster.NoMemberCriticalCap())
	sender := testkit.DialWS(t, c.Nodes[0].WSURL())
	sender.Login(testcluster.TokenWith(t, "fast", "order", nil, auth.WithLanes(auth.LaneCritical)))
	receiver := testkit.DialTCP(t, c.Nodes[1].TCPAddr())
	receiver.Login(testcluster.Token(t, "reader", "order"))

	const n = 30
	for i := 1; i <= n; i++ { // no waiting for acks; critical, so no budget thins them
		f := sendFrame(uint64(i), fmt.Sprint(i))
		f.GetSend().Lane = clientpb.Lane_LANE_CRITICAL
		sender.Send(f)
	}
	var lastID string
	for i := 1; i <= n; i++ {
		ack := sender.Next().GetSendAck()
		if ack == nil || ack.Seq != uint64(i) || ack.MessageId <= lastID {
			t.Fatalf("ack %d: %v (previous id %s)", i, ack, lastID)
		}
		lastID = ack.MessageId
	}
	for got := 0; got < n; {
		for _, m := range receiver.Next().GetPush().GetMessages() {
			got++
			if string(m.Body) != fmt.Sprint(got) {
				t.Fatalf("message %d has body %q: out of order", got, m.Body)
			}
		}
	}
}
