package presence_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/presence"
)

// TestLeaseEndEmitsLogouts kills a ChatLink without a goodbye: within its lease each of its
// sessions gets one logout with the reason "lease ended", on NATS and at the webhook, emitted by
// one of the two presence instances; the other node's session stays online.
func TestLeaseEndEmitsLogouts(t *testing.T) {
	t.Parallel()
	hook, posted := webhook(t)
	const interval = 100 * time.Millisecond // the lease is 3 intervals
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks, cfg.ServiceInstances, cfg.LeaseInterval = 2, 2, interval
		cfg.Presence = presence.Config{Webhooks: map[string]string{devcluster.App: hook.URL}, WebhookEvery: 20 * time.Millisecond}
	})

	nc, err := bus.Connect(c.NATSURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	type seen struct {
		ev *buspb.SessionEvent
		at time.Time
	}
	var evMu sync.Mutex
	var logouts []seen
	sub, err := nc.Subscribe(bus.AppEventsSubject(devcluster.App), func(m *nats.Msg) {
		var evs buspb.SessionEvents
		if proto.Unmarshal(m.Data, &evs) != nil {
			return
		}
		evMu.Lock()
		defer evMu.Unlock()
		for _, ev := range evs.Events {
			if ev.Kind == buspb.SessionEvent_KIND_LOGOUT {
				logouts = append(logouts, seen{ev, time.Now()})
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = nc.Flush()

	var doomed []string
	for _, uid := range []string{"ann", "bob", "cy"} {
		ack := testkit.DialTCP(t, c.Nodes[1].TCPAddr()).Login(testcluster.Token(t, uid, "r1"))
		doomed = append(doomed, ack.SessionId)
	}
	login(t, c.Nodes[0].TCPAddr(), "dee", "web")
	for _, p := range c.Presences {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if n := p.Sessions(); n != 4 {
				return fmt.Errorf("a presence instance knows %d sessions, want 4", n)
			}
			return nil
		})
	}

	killed := time.Now()
	c.Nodes[1].Kill()
	lease := 3 * interval
	testkit.CheckFor(t, lease+2*time.Second, 5*time.Millisecond, func() error {
		evMu.Lock()
		defer evMu.Unlock()
		if len(logouts) < len(doomed) {
			return fmt.Errorf("%d logouts, want %d", len(logouts), len(doomed))
		}
		return nil
	})
	// Both instances have seen the lease end by now; give a duplicate time to arrive.
	for _, p := range c.Presences {
		testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
			if n := p.Sessions(); n != 1 {
				return fmt.Errorf("a presence instance still knows %d sessions, want 1", n)
			}
			return nil
		})
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		var emitted, skipped int64
		for _, p := range c.Presences {
			e, s := p.LeaseEndLogouts()
			emitted, skipped = emitted+e, skipped+s
		}
		if emitted != 3 || skipped != 3 {
			return fmt.Errorf("instances emitted %d logouts and left %d to the other; want 3 and 3", emitted, skipped)
		}
		return nil
	})
	evMu.Lock()
	var got []string
	last := killed
	for _, s := range logouts {
		if s.ev.Reason != presence.ReasonLeaseEnded || s.ev.Node != c.Nodes[1].Name() {
			t.Errorf("logout %v: want reason %q on %s", s.ev, presence.ReasonLeaseEnded, c.Nodes[1].Name())
		}
		got = append(got, s.ev.SessionId)
		if s.at.After(last) {
			last = s.at
		}
	}
	evMu.Unlock()
	slices.Sort(got)
	slices.Sort(doomed)
	if !slices.Equal(got, doomed) {
		t.Fatalf("logouts for %v, want one each for %v", got, doomed)
	}
	// The lease runs from the node's last report, at most one interval before the kill; the
	// expiry looks every lease/5.
	if took := last.Sub(killed); took > lease+lease/5+interval {
		t.Errorf("logouts came %v after the kill; the lease is %v", took, lease)
	}
	t.Logf("logouts of the killed node's sessions came %v after the kill (lease %v)", last.Sub(killed).Round(time.Millisecond), lease)

	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		var offline []string
		for _, ev := range posted() {
			if ev.Kind == "offline" {
				if ev.Reason != presence.ReasonLeaseEnded {
					return fmt.Errorf("webhook offline event %+v without reason %q", ev, presence.ReasonLeaseEnded)
				}
				offline = append(offline, ev.SessionID)
			}
		}
		slices.Sort(offline)
		if !slices.Equal(offline, doomed) {
			return fmt.Errorf("webhook offline events for %v, want %v", offline, doomed)
		}
		return nil
	})
}

// webhook starts an app's webhook; posted returns the events it received so far.
func webhook(t *testing.T) (hook *httptest.Server, posted func() []presence.WebhookEvent) {
	var mu sync.Mutex
	var events []presence.WebhookEvent
	hook = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b presence.WebhookBatch
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.App != devcluster.App {
			t.Errorf("webhook got %v %v", b, err)
		}
		mu.Lock()
		events = append(events, b.Events...)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	return hook, func() []presence.WebhookEvent {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

// TestLeaseEndsTwice: a node whose reports stop (a region cut off from the services) loses its
// lease with its sessions still connected; its reports come back (the cut heals), presence takes
// its sessions back from its snapshot, and its reports stop again. Each lease end owes the
// node's sessions their logouts: the second too, although the node has the same boot. The node
// is the test's own, publishing its session stream on the bus as a ChatLink does.
func TestLeaseEndsTwice(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond // the lease is 3 intervals
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ServiceInstances, cfg.LeaseInterval = 2, interval
	})
	nc, err := bus.Connect(c.NATSURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var evMu sync.Mutex
	var logouts []*buspb.SessionEvent
	sub, err := nc.Subscribe(bus.AppEventsSubject(devcluster.App), func(m *nats.Msg) {
		var evs buspb.SessionEvents
		if proto.Unmarshal(m.Data, &evs) != nil {
			return
		}
		evMu.Lock()
		defer evMu.Unlock()
		for _, ev := range evs.Events {
			if ev.Kind == buspb.SessionEvent_KIND_LOGOUT && ev.Node == "far-1" {
				logouts = append(logouts, ev)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = nc.Flush()

	const node, boot = "far-1", "boot-1"
	login := &buspb.SessionEvent{
		Kind: buspb.SessionEvent_KIND_LOGIN, App: devcluster.App, Uid: "ann", Room: "r1", Node: node,
		SessionId: "far-1-s1", Device: "web", TimeMs: time.Now().UnixMilli(),
	}
	var seqMu sync.Mutex // guards seq, the node's stream's last
	var seq uint64
	publish := func(subject string, m func(seq uint64) proto.Message) {
		seqMu.Lock()
		defer seqMu.Unlock()
		seq++
		if err := bus.Publish(nc, subject, m(seq)); err != nil {
			t.Error(err)
		}
	}
	// reporting renews the node's lease, reporting its one session, until the function it
	// returns is called.
	reporting := func() (stop func()) {
		done, stopped := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(stopped)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				publish(bus.SubjectSessionsReport, func(seq uint64) proto.Message {
					return &buspb.NodeReport{Node: node, Boot: boot, Seq: seq, TimeMs: time.Now().UnixMilli(), Sessions: 1, Last: true}
				})
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()
		return func() { close(done); <-stopped }
	}
	online := func(want int) {
		t.Helper()
		for _, p := range c.Presences {
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
				if n := p.Sessions(); n != want {
					return fmt.Errorf("a presence instance knows %d sessions, want %d", n, want)
				}
				return nil
			})
		}
	}
	loggedOut := func(want int) {
		t.Helper()
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			evMu.Lock()
			defer evMu.Unlock()
			if len(logouts) != want {
				return fmt.Errorf("%d logouts of the node's session, want %d", len(logouts), want)
			}
			return nil
		})
	}

	publish(bus.SubjectPresenceEvents, func(seq uint64) proto.Message {
		return &buspb.SessionEvents{Node: node, Boot: boot, Seq: seq, Events: []*buspb.SessionEvent{login}}
	})
	stop := reporting()
	online(1)
	// The reports stop: the lease ends, and the session gets its logout.
	stop()
	loggedOut(1)
	online(0)
	// They come back, with the node's snapshot (what it sends when presence asks, after two
	// reports that disagree with its view).
	stop = reporting()
	publish(bus.SubjectSessionsSnapshot, func(seq uint64) proto.Message {
		return &buspb.NodeSnapshot{Node: node, Boot: boot, Seq: seq, Sessions: []*buspb.SessionEvent{login}, Last: true}
	})
	online(1)
	// They stop again: the session is dropped again, and its logout owed again.
	stop()
	loggedOut(2)
	online(0)
	// Once each, though two instances saw each end.
	time.Sleep(5 * interval)
	loggedOut(2)
	evMu.Lock()
	defer evMu.Unlock()
	for _, ev := range logouts {
		if ev.Reason != presence.ReasonLeaseEnded || ev.SessionId != login.SessionId {
			t.Errorf("logout %v: want session %s, reason %q", ev, login.SessionId, presence.ReasonLeaseEnded)
		}
	}
}
