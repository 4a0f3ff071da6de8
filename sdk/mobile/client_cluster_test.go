package mobile_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/auth"
	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk/mobile"
)

// recorder is a Listener that keeps what it got, in order, and notices overlapping calls.
type recorder struct {
	active  atomic.Int32
	overlap atomic.Bool // two Listener calls ran at once

	mu     sync.Mutex // guards the fields below
	msgs   []*mobile.Message
	events []*mobile.Event
	order  []string // "message" or the event's kind, in the order of the calls
}

func (r *recorder) enter() func() {
	if r.active.Add(1) > 1 {
		r.overlap.Store(true)
	}
	time.Sleep(time.Millisecond) // widen the window an overlapping call would need
	return func() { r.active.Add(-1) }
}

func (r *recorder) OnMessage(m *mobile.Message) {
	defer r.enter()()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	r.order = append(r.order, "message")
}

func (r *recorder) OnEvent(e *mobile.Event) {
	defer r.enter()()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	r.order = append(r.order, e.Kind)
}

func (r *recorder) bodies() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = string(m.Body)
	}
	return out
}

func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

// event returns the first event after the from-th call that matches, or nil.
func (r *recorder) event(from int, match func(*mobile.Event) bool) (*mobile.Event, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i, kind := range r.order {
		if kind == "message" {
			continue
		}
		e := r.events[n]
		n++
		if i >= from && match(e) {
			return e, i
		}
	}
	return nil, -1
}

func kind(k string) func(*mobile.Event) bool {
	return func(e *mobile.Event) bool { return e.Kind == k }
}

// waitEvent waits until r got an event after the from-th call that matches and returns it with
// its position.
func waitEvent(t *testing.T, r *recorder, from int, what string, match func(*mobile.Event) bool) (*mobile.Event, int) {
	t.Helper()
	var e *mobile.Event
	var at int
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if e, at = r.event(from, match); e == nil {
			return fmt.Errorf("no %s event after call %d: %q", what, from, r.kinds())
		}
		return nil
	})
	return e, at
}

func newClient(t *testing.T, c *devcluster.Cluster, uid, room string, cfg mobile.Config, l mobile.Listener) *mobile.Client {
	t.Helper()
	// The tests send critical messages, which no budget thins: their members may.
	tok, err := c.Mint(uid, room, nil, time.Hour, auth.WithLanes(auth.LaneCritical))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Token, cfg.Dispatcher = tok, c.URL()
	cl, err := mobile.NewClient(&cfg, l)
	if err != nil {
		t.Fatalf("NewClient %s: %v", uid, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

var transports = []string{mobile.TransportWebSocket, mobile.TransportTCP}

func TestLoginSendReceive(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), testcluster.NoMemberCriticalCap())
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			room := "chat-" + transport
			var alice, bob recorder
			sender := newClient(t, c, "alice", room, mobile.Config{Transport: transport}, &alice)
			newClient(t, c, "bob", room, mobile.Config{Transport: transport}, &bob)

			connected, _ := waitEvent(t, &alice, 0, "connected", kind(mobile.EventConnected))
			if connected.Node != c.Nodes[0].Name() || !strings.HasPrefix(connected.SessionID, connected.Node) || connected.Reconnected {
				t.Errorf("connected event %+v, want node %s, its session, not reconnected", connected, c.Nodes[0].Name())
			}

			const n = 20
			var want []string
			for i := range n {
				// Critical: the room's budget may thin a burst of normal ones.
				res, err := sender.Send(&mobile.Outgoing{Type: "chat", Lane: mobile.LaneCritical, Body: []byte(strconv.Itoa(i))})
				if err != nil {
					t.Fatalf("Send %d: %v", i, err)
				}
				if len(res.MessageID) != 26 || res.ServerTimeMs == 0 || res.ErrorCode != 0 {
					t.Fatalf("Send %d: result %+v, want an id and a time", i, res)
				}
				want = append(want, strconv.Itoa(i))
			}
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
				if got := bob.bodies(); len(got) < n {
					return fmt.Errorf("bob has %d of %d messages", len(got), n)
				}
				return nil
			})
			if got := bob.bodies(); !slices.Equal(got, want) {
				t.Errorf("bob got %q, want %q in order", got, want)
			}
			bob.mu.Lock()
			m := bob.msgs[0]
			bob.mu.Unlock()
			if m.Sender != "alice" || m.Room != room || m.Type != "chat" || m.Lane != mobile.LaneCritical || len(m.ID) != 26 || m.RoomSeq == 0 {
				t.Errorf("bob's first message %+v, want alice's critical chat in %s, numbered", m, room)
			}
			if bob.overlap.Load() {
				t.Error("two Listener calls ran at once")
			}
			if got := alice.bodies(); len(got) != 0 {
				t.Errorf("alice got her own messages back: %q", got)
			}
			if sender.LastID() != "" {
				t.Errorf("alice's LastID = %q before receiving anything", sender.LastID())
			}
		})
	}
}

func TestSendRefusedAndInvalid(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	cl := newClient(t, c, "alice", "lobby", mobile.Config{}, nil)

	res, err := cl.Send(&mobile.Outgoing{Type: "chat"}) // empty body: the server refuses it
	if err != nil || res.ErrorCode != 100 || res.ErrorMessage == "" || res.MessageID != "" || res.Temporary {
		t.Errorf("empty body: %+v, %v; want a refusal with code 100 (BAD_REQUEST), not an error", res, err)
	}
	if _, err := cl.Send(&mobile.Outgoing{Type: "chat", Lane: "urgent", Body: []byte("x")}); err == nil || !strings.Contains(err.Error(), "unknown lane") {
		t.Errorf("unknown lane: err = %v", err)
	}
	if _, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: make([]byte, 70000)}); err == nil || !strings.Contains(err.Error(), "frame too large") {
		t.Errorf("70,000 bytes: err = %v", err)
	}
	if _, err := cl.Send(nil); err == nil {
		t.Error("Send(nil) succeeded")
	}
	if cl.Closed() {
		t.Error("the client closed after refused sends")
	}
}

func TestNewClientErrors(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	tok, err := c.Mint("mallory", "lobby", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *mobile.Config
		want string
	}{
		{"no config", nil, "needs a Config"},
		{"no dispatcher", &mobile.Config{Token: tok}, "needs Dispatcher"},
		{"no token", &mobile.Config{Dispatcher: c.URL()}, "no token"},
		{"unknown transport", &mobile.Config{Token: tok, Dispatcher: c.URL(), Transport: "quic"}, "unknown transport"},
		{"forged token", &mobile.Config{Token: tok[:len(tok)-4] + "AAAA", Dispatcher: c.URL()}, "code 4001"},
		{"nothing listening", &mobile.Config{Token: tok, Dispatcher: "http://" + testkit.FreeAddr(t), ConnectTimeoutMs: 2000}, "dispatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			cl, err := mobile.NewClient(tc.cfg, &r)
			if err == nil {
				cl.Close()
				t.Fatal("NewClient succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestReconnectEvents: when its ChatLink dies, the client says it is reconnecting, connects
// to the other one, recovers what was sent meanwhile, and says so, in that order.
func TestReconnectEvents(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	var viewer, sender recorder
	cfg := mobile.Config{ReconnectMinDelayMs: 100, ReconnectMaxDelayMs: 500}
	v := newClient(t, c, "viewer", "stage", cfg, &viewer)
	connected, _ := waitEvent(t, &viewer, 0, "connected", kind(mobile.EventConnected))
	s := newClient(t, c, "sender", "stage", cfg, &sender)
	send := func(body string) {
		t.Helper()
		if res, err := s.Send(&mobile.Outgoing{Type: "chat", Lane: mobile.LaneCritical, Body: []byte(body)}); err != nil || res.ErrorCode != 0 {
			t.Fatalf("Send %s: %+v, %v", body, res, err)
		}
	}
	send("before")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(viewer.bodies()) < 1 {
			return fmt.Errorf("viewer got %q", viewer.bodies())
		}
		return nil
	})
	if v.LastID() == "" {
		t.Error("LastID empty after a message")
	}

	victim := c.Nodes[0]
	if victim.Name() != connected.Node {
		victim = c.Nodes[1]
	}
	from := len(viewer.kinds())
	victim.Kill()
	reconnecting, at := waitEvent(t, &viewer, from, "reconnecting", kind(mobile.EventReconnecting))
	if reconnecting.Attempt != 1 || reconnecting.DelayMs <= 0 || reconnecting.DelayMs > 500 || reconnecting.Error == "" {
		t.Errorf("reconnecting event %+v, want attempt 1, a delay up to 500ms, why", reconnecting)
	}
	send("meanwhile") // the sender may be on the killed node too: Send waits for its reconnect
	back, at := waitEvent(t, &viewer, at, "reconnected", func(e *mobile.Event) bool { return e.Kind == mobile.EventConnected && e.Reconnected })
	if back.Node == victim.Name() {
		t.Errorf("reconnected to the killed node %s", back.Node)
	}
	recovered, _ := waitEvent(t, &viewer, at, "recovered", kind(mobile.EventRecovered))
	if !recovered.Recovered || recovered.Missing != 0 || recovered.Error != "" {
		t.Errorf("recovered event %+v, want recovered: true", recovered)
	}
	send("after")
	want := []string{"before", "meanwhile", "after"}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := viewer.bodies(); !slices.Equal(got, want) {
			return fmt.Errorf("viewer got %q, want %q", got, want)
		}
		return nil
	})
	if v.Closed() {
		t.Error("Closed after a reconnect")
	}
}

// TestKicked: a kick from the server API ends the client: a terminal "kicked" event, then
// "closed" with the code.
func TestKicked(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	var r recorder
	cl := newClient(t, c, "mallory", "lobby", mobile.Config{}, &r)
	waitEvent(t, &r, 0, "connected", kind(mobile.EventConnected))

	// The session is known to presence a moment after the login: until then the kick finds
	// no one (404).
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL()+"/v1/users/mallory/kick", strings.NewReader(`{"reason":"be nice"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kick: %s", resp.Status)
		}
		return nil
	})
	kicked, at := waitEvent(t, &r, 0, "kicked", kind(mobile.EventKicked))
	if kicked.Code != 4007 || kicked.Reason != "be nice" || !kicked.Terminal {
		t.Errorf("kicked event %+v, want code 4007 (KICKED), the reason, terminal", kicked)
	}
	closed, _ := waitEvent(t, &r, at, "closed", kind(mobile.EventClosed))
	if closed.Code != 4007 || closed.Error == "" {
		t.Errorf("closed event %+v, want code 4007 and why", closed)
	}
	if !cl.Closed() {
		t.Error("Closed() = false after a terminal kick")
	}
	if _, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: []byte("x")}); err == nil {
		t.Error("Send succeeded after the client stopped")
	}
}

// TestCloseWithoutLeaks: Close ends the client and everything it started, the last event is
// "closed", a Send waiting for a connection returns, and a second Close does nothing.
func TestCloseWithoutLeaks(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	// The first session makes the servers start what they keep for good (NATS reply
	// subscriptions): not a leak.
	first := newClient(t, c, "warmup", "lobby", mobile.Config{}, nil)
	first.Close()
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			var r recorder
			cl := newClient(t, c, "alice-"+transport, "lobby", mobile.Config{Transport: transport}, &r)
			waitEvent(t, &r, 0, "connected", kind(mobile.EventConnected))
			cl.Close()
			cl.Close()
			if got := r.kinds(); len(got) == 0 || got[len(got)-1] != mobile.EventClosed {
				t.Errorf("events %q, want closed last", got)
			}
			closed, _ := r.event(0, kind(mobile.EventClosed))
			if closed == nil || !strings.Contains(closed.Error, "client closed") || closed.Code != 0 {
				t.Errorf("closed event %+v, want \"client closed\"", closed)
			}
			if !cl.Closed() {
				t.Error("Closed() = false after Close")
			}
			if _, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: []byte("x")}); err == nil {
				t.Error("Send succeeded after Close")
			}
			// Both the client's goroutines and the ChatLink's for this connection must be gone.
			// A ChatLink reader that read for it and now waits for another connection's read is not
			// the connection's: the node keeps it for up to a second (chatlink/polled.go), longer on
			// a busy machine; one still reading has another function on top.
			goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("roomcast/chatlink.(*Node).reader"))
		})
	}
}

// TestCloseEndsWaitingSend: a Send waiting for a connection while the client reconnects
// returns when Close is called, not when its timeout runs out.
func TestCloseEndsWaitingSend(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	var r recorder
	cl := newClient(t, c, "alice", "lobby", mobile.Config{SendTimeoutMs: 60_000}, &r)
	waitEvent(t, &r, 0, "connected", kind(mobile.EventConnected))
	c.Nodes[0].Kill() // no ChatLink left: the client keeps trying
	waitEvent(t, &r, 0, "reconnecting", kind(mobile.EventReconnecting))

	done := make(chan error, 1)
	go func() {
		_, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: []byte("x")})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the Send start waiting; a Send after Close fails too
	start := time.Now()
	cl.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Send succeeded with no ChatLink")
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Send returned %v after Close", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send still waiting 5s after Close")
	}
}

// TestLimitedLogins: six members log in at once to a room whose join rate lets two in at
// once; NewClient waits out each Kick 4013 (a "limited" event with the code and the delay)
// and every one logs in.
func TestLimitedLogins(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.JoinsPerRoom = ratelimit.Limit{Rate: 5, Burst: 2}
	})
	const members = 6
	recs := make([]*recorder, members)
	var wg sync.WaitGroup
	for i := range recs {
		recs[i] = &recorder{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			newClient(t, c, "m"+strconv.Itoa(i), "crowd", mobile.Config{}, recs[i])
		}()
	}
	wg.Wait()
	limited := 0
	for _, r := range recs {
		waitEvent(t, r, 0, "connected", kind(mobile.EventConnected))
		for at := 0; ; at++ {
			e, i := r.event(at, kind(mobile.EventLimited))
			if e == nil {
				break
			}
			if e.Code != 4013 || e.RetryAfterMs <= 0 || e.DelayMs < e.RetryAfterMs {
				t.Errorf("limited event %+v: want code 4013, a hint and a delay no shorter", e)
			}
			limited, at = limited+1, i
		}
	}
	if limited < members-2 {
		t.Errorf("%d limited events, want at least %d", limited, members-2)
	}
}
