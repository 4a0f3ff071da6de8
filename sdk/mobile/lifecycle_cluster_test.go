package mobile_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk/mobile"
)

// freezer is a TCP proxy to one ChatLink whose connections can be made to stop forwarding
// without closing: what a phone's connection looks like after it left a network (nothing
// arrives, nothing says so).
type freezer struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed when the test ends: frozen pumps return

	mu    sync.Mutex // guards the field below
	flags []*atomic.Bool
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezer{ln: ln, target: target, done: make(chan struct{})}
	var wg sync.WaitGroup
	var conns []net.Conn
	var connsMu sync.Mutex
	t.Cleanup(func() {
		close(p.done)
		ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			frozen := new(atomic.Bool)
			p.mu.Lock()
			p.flags = append(p.flags, frozen)
			p.mu.Unlock()
			connsMu.Lock()
			conns = append(conns, client, server)
			connsMu.Unlock()
			wg.Add(2)
			go p.pump(&wg, client, server, frozen)
			go p.pump(&wg, server, client, frozen)
		}
	}()
	return p
}

// pump copies src to dst until either ends, or, once frozen, reads src and drops what it read
// until the test ends.
func (p *freezer) pump(wg *sync.WaitGroup, src, dst net.Conn, frozen *atomic.Bool) {
	defer wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			if !frozen.Load() {
				dst.Close()
			}
			return
		}
		if frozen.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			return
		}
	}
}

// freeze makes every connection made so far stop forwarding; later ones forward.
func (p *freezer) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.flags {
		f.Store(true)
	}
}

// dispatchThrough serves a dispatcher that answers as c's does, but with the first ChatLink
// only, at the proxy's address for TCP.
func dispatchThrough(t *testing.T, c *devcluster.Cluster, proxy *freezer) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(c.URL() + r.URL.RequestURI())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var a map[string]any
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, &a); err != nil || resp.StatusCode != http.StatusOK {
			http.Error(w, string(body), resp.StatusCode)
			return
		}
		nodes, _ := a["nodes"].([]any)
		if len(nodes) == 0 {
			http.Error(w, "no nodes", http.StatusServiceUnavailable)
			return
		}
		first := nodes[0].(map[string]any)
		first["tcp_addr"] = proxy.ln.Addr().String()
		a["nodes"] = []any{first}
		json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestNetworkChanged: a client whose connection silently died (the proxy stopped forwarding
// without closing) is back, with what was sent meanwhile recovered, within 3 s of
// NetworkChanged; without the call it would take three heartbeat intervals (75 s by default).
func TestNetworkChanged(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), testcluster.NoMemberCriticalCap())
	proxy := startFreezer(t, c.Nodes[0].TCPAddr())
	var alice, bob recorder
	sender := newClient(t, c, "alice", "net", mobile.Config{}, &alice)
	receiver := newThroughClient(t, c, dispatchThrough(t, c, proxy), "bob", "net", mobile.Config{}, &bob)

	send(t, sender, "before")
	waitBodies(t, &bob, "before")
	proxy.freeze()
	send(t, sender, "while dead")
	from := len(bob.kinds())

	start := time.Now()
	receiver.NetworkChanged()
	waitWithin(t, 3*time.Second, &bob, from, "before", "while dead")
	t.Logf("back and recovered %v after NetworkChanged", time.Since(start).Round(time.Millisecond))
}

// TestHeartbeatShortened: with HeartbeatIntervalMs the client notices a silently dead
// connection after three of its own intervals rather than the server's 25 s ones.
func TestHeartbeatShortened(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), testcluster.NoMemberCriticalCap())
	proxy := startFreezer(t, c.Nodes[0].TCPAddr())
	var alice, bob recorder
	sender := newClient(t, c, "alice", "hb", mobile.Config{}, &alice)
	newThroughClient(t, c, dispatchThrough(t, c, proxy), "bob", "hb", mobile.Config{HeartbeatIntervalMs: 300}, &bob)

	send(t, sender, "before")
	waitBodies(t, &bob, "before")
	from := len(bob.kinds())
	proxy.freeze()
	send(t, sender, "while dead")
	waitWithin(t, 3*time.Second, &bob, from, "before", "while dead")
}

// TestBackgroundForeground: in the background the client keeps its connection for
// BackgroundLingerMs, then pauses; in the foreground it connects again and recovers what was
// sent meanwhile.
func TestBackgroundForeground(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), testcluster.NoMemberCriticalCap())
	var alice, bob recorder
	sender := newClient(t, c, "alice", "bg", mobile.Config{}, &alice)
	receiver := newClient(t, c, "bob", "bg", mobile.Config{BackgroundLingerMs: 300}, &bob)

	send(t, sender, "before")
	waitBodies(t, &bob, "before")
	receiver.EnterBackground()
	send(t, sender, "lingering") // still connected
	waitBodies(t, &bob, "before", "lingering")
	_, at := waitEvent(t, &bob, 0, "paused", kind(mobile.EventPaused))
	if !receiver.Paused() {
		t.Fatal("Paused() is false after the paused event")
	}
	send(t, sender, "in the background")
	receiver.NetworkChanged() // no effect while paused
	time.Sleep(200 * time.Millisecond)
	if got := bob.bodies(); len(got) != 2 {
		t.Fatalf("bob got %q while paused", got)
	}
	receiver.EnterForeground()
	waitWithin(t, 3*time.Second, &bob, at, "before", "lingering", "in the background")
	if receiver.Paused() {
		t.Error("Paused() is true in the foreground")
	}
}

func newThroughClient(t *testing.T, c *devcluster.Cluster, dispatcher, uid, room string, cfg mobile.Config, l mobile.Listener) *mobile.Client {
	t.Helper()
	tok, err := c.Mint(uid, room, nil, time.Hour, auth.WithLanes(auth.LaneCritical))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Token, cfg.Dispatcher, cfg.Transport = tok, dispatcher, mobile.TransportTCP
	cl, err := mobile.NewClient(&cfg, l)
	if err != nil {
		t.Fatalf("NewClient %s: %v", uid, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func send(t *testing.T, from *mobile.Client, body string) {
	t.Helper()
	res, err := from.Send(&mobile.Outgoing{Type: "chat", Lane: mobile.LaneCritical, Body: []byte(body)})
	if err != nil || res.ErrorCode != 0 {
		t.Fatalf("send %q: %+v, %v", body, res, err)
	}
}

func waitBodies(t *testing.T, r *recorder, want ...string) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := r.bodies(); !slices.Equal(got, want) {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	})
}

// waitWithin waits, at most limit, for r to have reconnected and recovered after its from-th
// call and to hold the messages want.
func waitWithin(t *testing.T, limit time.Duration, r *recorder, from int, want ...string) {
	t.Helper()
	start := time.Now()
	for {
		connected, _ := r.event(from, func(e *mobile.Event) bool { return e.Kind == mobile.EventConnected && e.Reconnected })
		recovered, _ := r.event(from, kind(mobile.EventRecovered))
		got := r.bodies()
		if connected != nil && recovered != nil && slices.Equal(got, want) {
			if !recovered.Recovered {
				t.Fatalf("recovered event %+v, want Recovered", recovered)
			}
			return
		}
		if time.Since(start) > limit {
			t.Fatalf("after %v: reconnected %v, recovered %+v, messages %q (want %q); calls %q",
				limit, connected != nil, recovered, got, want, r.kinds())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
