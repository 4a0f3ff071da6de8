package chatlink_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// TestLoginPace: a burst of logins is processed at the node's login rate, the connections open
// meanwhile; a member already on the node keeps getting its room's messages while they wait;
// and the login that finds the queue full is refused with Error 121 and Kick 4013, the retry
// hint the time the queue takes to drain. A token that does not verify is refused at once,
// without waiting for the pace.
func TestLoginPace(t *testing.T) {
	t.Parallel()
	const (
		rate  = 4 // logins a second: 250ms a login, so a loaded -race run still gets the crowd's logins to the pace before a second token comes
		queue = 6
		crowd = 8 // logins sent at once: one takes the bucket's token, 6 wait, one is refused
	)
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.LoginRate = ratelimit.Limit{Rate: rate, Burst: 1}
		cfg.ChatLink.Limits.LoginQueue = queue
	})
	node := c.Nodes[0]
	sender, member := testkit.DialTCP(t, node.TCPAddr()), testkit.DialTCP(t, node.TCPAddr())
	sender.Login(testcluster.Token(t, "sender", "held"))
	time.Sleep(time.Second / rate) // the bucket's token is back
	member.Login(testcluster.Token(t, "member", "held"))
	time.Sleep(time.Second / rate)

	type answer struct {
		f  *clientpb.Frame
		at time.Duration
	}
	answers := make(chan answer, crowd)
	clients := make([]*testkit.Client, crowd)
	for i := range clients {
		clients[i] = testkit.DialTCP(t, node.TCPAddr())
	}
	start := time.Now()
	for i, cl := range clients {
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, fmt.Sprintf("u%d", i), "pace"), Device: "test"}}})
		go func() {
			select {
			case f := <-cl.Frames():
				answers <- answer{f, time.Since(start)}
			case <-time.After(10 * time.Second):
				answers <- answer{}
			}
		}()
	}

	// While the crowd waits, a member already on the node gets its room's messages.
	queued := func() int { return metricValue(t, c, `roomcast_chatlink_login_queue{node="`+node.Name()+`"}`) }
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if q := queued(); q < queue/2 {
			return fmt.Errorf("%d logins waiting", q)
		}
		return nil
	})
	sent := time.Now()
	sender.Send(sendFrame(1, "during the queue"))
	if msgs := member.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "during the queue" {
		t.Fatalf("want the sender's message, got %v", msgs)
	}
	if d := time.Since(sent); d > time.Second {
		t.Errorf("the message took %v to reach the member while logins waited", d)
	}
	if queued() == 0 {
		t.Errorf("the queue drained before the message reached the member: that proves nothing")
	}

	// A token that does not verify is refused at once: it takes no place in the queue.
	bad := testkit.DialTCP(t, node.TCPAddr())
	asked := time.Now()
	bad.Send(loginFrame("not.a.token"))
	if k := bad.Next().GetKick(); k.GetCode() != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
		t.Errorf("a bad token while logins waited: kick %v, want %d", k, clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN)
	}
	if queued() == 0 {
		// Behind the crowd it would be answered only once the queue drained.
		t.Errorf("a bad token was answered after %v, when the queue had drained: it waited for the pace", time.Since(asked))
	}

	var acks []time.Duration
	refused := 0
	for range crowd {
		a := <-answers
		switch e := a.f.GetError(); {
		case a.f.GetLoginAck() != nil:
			acks = append(acks, a.at)
		case e != nil && e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_LOGIN_RATE_LIMITED):
			refused++
			// The queue was full: it drains in queue/rate.
			if want := uint32(queue * 1000 / rate); e.RetryAfterMs < want*9/10 || e.RetryAfterMs > want {
				t.Errorf("refused login: retry_after_ms %d, want about %d", e.RetryAfterMs, want)
			}
		default:
			t.Fatalf("login answered with %v", a.f)
		}
	}
	if refused != 1 || len(acks) != crowd-1 {
		t.Fatalf("%d logins acknowledged and %d refused, want %d and 1", len(acks), refused, crowd-1)
	}
	slices.Sort(acks)
	// The first takes the token at once, the others one every 1/rate after it.
	if want := time.Duration(queue) * time.Second / rate * 9 / 10; acks[len(acks)-1]-acks[0] < want {
		t.Errorf("%d logins acknowledged within %v: not paced at %d/s (want at least %v)", len(acks), acks[len(acks)-1]-acks[0], rate, want)
	}
	if n := metricValue(t, c, `roomcast_chatlink_logins_paced_total{node="`+node.Name()+`"}`); n != queue {
		t.Errorf("logins_paced_total = %d, want %d", n, queue)
	}
	if n := limitedCount(t, c, node.Name(), "login_node"); n != 1 {
		t.Errorf("limited_total{login_node} = %d, want 1", n)
	}
}
