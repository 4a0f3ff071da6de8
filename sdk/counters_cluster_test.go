package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// counterMember is a member dialled straight to one ChatLink, recording its counter events.
type counterMember struct {
	cl *sdk.Client

	mu      sync.Mutex
	refused []*sdk.CounterRefusedEvent
}

func (m *counterMember) refusals() []*sdk.CounterRefusedEvent {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*sdk.CounterRefusedEvent(nil), m.refused...)
}

func dialCounterMember(t *testing.T, c *devcluster.Cluster, node *chatlink.Node, uid, room string) *counterMember {
	t.Helper()
	m := &counterMember{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, sdk.Config{
		Token:     testcluster.Token(t, uid, room),
		Endpoints: []sdk.Endpoint{{Node: node.Name(), WSURL: node.WSURL(), TCPAddr: node.TCPAddr()}},
		OnEvent: func(e sdk.Event) {
			if r, ok := e.(*sdk.CounterRefusedEvent); ok {
				m.mu.Lock()
				m.refused = append(m.refused, r)
				m.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatalf("dial %s: %v", uid, err)
	}
	t.Cleanup(func() { cl.Close() })
	m.cl = cl
	return m
}

// waitTotals waits until every member's totals are want.
func waitTotals(t *testing.T, members []*counterMember, want map[string]int64) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for i, m := range members {
			if got, _ := m.cl.Counters(); !maps.Equal(got, want) {
				return fmt.Errorf("member %d sees %v, want %v", i, got, want)
			}
		}
		return nil
	})
}

// apiCounters reads a room's counters through the server API's HTTP route.
func apiCounters(t *testing.T, c *devcluster.Cluster, room string) map[string]int64 {
	t.Helper()
	var out struct {
		Counters []struct {
			Name  string `json:"name"`
			Total any    `json:"total"`
		} `json:"counters"`
	}
	if code := testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/counters", devcluster.APIKey, "", &out); code != http.StatusOK {
		t.Fatalf("GET counters: HTTP %d", code)
	}
	got := make(map[string]int64)
	for _, ct := range out.Counters {
		var n int64
		fmt.Sscan(fmt.Sprint(ct.Total), &n)
		got[ct.Name] = n
	}
	return got
}

// TestCountersExactAcrossChatLinks: 24 members on two ChatLinks, with two room service
// instances, tap likes and roses concurrently while the services are restarted (every room
// service instance at once: the ChatLinks' windows of the gap find nobody and are sent again);
// once the taps end, every member sees totals equal to the taps sent, and so does the server
// API: none lost, none counted twice.
func TestCountersExactAcrossChatLinks(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.ServiceInstances = 2
		// The members tap faster than a thumb (every 10 ms), to fill the windows.
		cfg.ChatLink.Limits.CounterAddsPerConn = ratelimit.Unlimited
	})
	const (
		perLink = 12
		taps    = 40
		room    = "taps"
	)
	var members []*counterMember
	for i := range 2 * perLink {
		members = append(members, dialCounterMember(t, c, c.Nodes[i%2], fmt.Sprintf("u%d", i), room))
	}
	var likes, roses atomic.Int64
	var wg sync.WaitGroup
	restarted := make(chan error, 1)
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for j := range taps {
				name, amount := "like", uint32(1)
				if (i+j)%5 == 0 {
					name, amount = "gift:rose", uint32(1+j%3)
				}
				if err := m.cl.AddCounter(ctx, name, amount); err != nil {
					t.Errorf("member %d: %v", i, err)
					return
				}
				if name == "like" {
					likes.Add(int64(amount))
				} else {
					roses.Add(int64(amount))
				}
				if i == 0 && j == taps/2 {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						defer cancel()
						restarted <- c.RestartServices(ctx)
					}()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		if r := m.refusals(); len(r) > 0 {
			t.Fatalf("member %d: %d adds refused, the first: %v", i, len(r), r[0].Err)
		}
	}
	want := map[string]int64{"like": likes.Load(), "gift:rose": roses.Load()}
	waitTotals(t, members, want)
	if got := apiCounters(t, c, room); !maps.Equal(got, want) {
		t.Errorf("the API reads %v, want %v", got, want)
	}
}

// TestCounterLimits: a member over its add rate gets Error 120 with a retry hint, an amount
// over the limit 100 and a bad name are refused, and the 33rd counter of a room 124; only what
// was not refused is counted.
func TestCounterLimits(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.CounterAddsPerConn = ratelimit.Limit{Rate: 1, Burst: 3}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := dialCounterMember(t, c, c.Nodes[0], "tapper", "limits")
	if err := m.cl.AddCounter(ctx, "bad name", 1); !errors.Is(err, sdk.ErrBadCounter) {
		t.Errorf("a name with a space: %v, want ErrBadCounter", err)
	}
	for range 6 {
		if err := m.cl.AddCounter(ctx, "like", 1); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := len(m.refusals()); n < 3 {
			return fmt.Errorf("%d refusals, want 3 (6 adds, a burst of 3)", n)
		}
		return nil
	})
	for _, r := range m.refusals() {
		if r.Err.Code != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) || r.Err.RetryAfter <= 0 || r.Name != "like" || !strings.Contains(r.Err.Message, "counter_conn") {
			t.Errorf("refusal %+v (%v): want 120 naming counter_conn, with a retry hint", r, r.Err)
		}
	}
	waitTotals(t, []*counterMember{m}, map[string]int64{"like": 3})

	// The amount: over 100 is refused (a fresh member, a fresh rate).
	big := dialCounterMember(t, c, c.Nodes[0], "big", "limits")
	if err := big.cl.AddCounter(ctx, "gift:rocket", 101); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := big.refusals(); len(r) != 1 || r[0].Err.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST) {
			return fmt.Errorf("refusals %v, want one 100", r)
		}
		return nil
	})

	// 32 counters a room: each member adds one new name (three adds each at most by its rate).
	var adders []*counterMember
	want := map[string]int64{"like": 3}
	for i := range 31 {
		a := dialCounterMember(t, c, c.Nodes[0], fmt.Sprintf("n%d", i), "limits")
		if err := a.cl.AddCounter(ctx, fmt.Sprintf("c%d", i), 2); err != nil {
			t.Fatal(err)
		}
		want[fmt.Sprintf("c%d", i)] = 2
		adders = append(adders, a)
	}
	// The 32 are counted before the 33rd is added: adds from different connections have no
	// order between them, and an adder's frame still on its way would make it the 33rd.
	waitTotals(t, []*counterMember{m}, want)
	last := dialCounterMember(t, c, c.Nodes[0], "last", "limits")
	if err := last.cl.AddCounter(ctx, "one-too-many", 1); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := last.refusals(); len(r) != 1 || r[0].Err.Code != uint32(clientpb.ErrorCode_ERROR_CODE_TOO_MANY_COUNTERS) || r[0].Name != "one-too-many" {
			return fmt.Errorf("refusals %v, want one 124", r)
		}
		return nil
	})
	for i, a := range adders {
		if r := a.refusals(); len(r) > 0 {
			t.Errorf("adder %d refused: %v", i, r[0].Err)
		}
	}
	waitTotals(t, []*counterMember{m, last}, want)
}

// TestCountersAPIAndRestart: the server API reads a room's totals and resets a counter (the
// members see it go), and the totals outlive a restart of the services: taps after it add to
// them.
func TestCountersAPIAndRestart(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := dialCounterMember(t, c, c.Nodes[0], "a", "show")
	b := dialCounterMember(t, c, c.Nodes[1], "b", "show")
	for range 4 {
		if err := a.cl.AddCounter(ctx, "like", 1); err != nil {
			t.Fatal(err)
		}
		if err := b.cl.AddCounter(ctx, "gift:rose", 5); err != nil {
			t.Fatal(err)
		}
	}
	members := []*counterMember{a, b}
	waitTotals(t, members, map[string]int64{"like": 4, "gift:rose": 20})
	if got := apiCounters(t, c, "show"); !maps.Equal(got, map[string]int64{"like": 4, "gift:rose": 20}) {
		t.Errorf("GET counters: %v", got)
	}
	var reset map[string]any
	if code := testcluster.Call(t, c, http.MethodDelete, "/v1/rooms/show/counters/gift:rose", devcluster.APIKey, "", &reset); code != http.StatusOK {
		t.Fatalf("DELETE counter: HTTP %d: %v", code, reset)
	}
	waitTotals(t, members, map[string]int64{"like": 4})
	if code := testcluster.Call(t, c, http.MethodDelete, "/v1/rooms/show/counters/bad%20name", devcluster.APIKey, "", nil); code != http.StatusBadRequest {
		t.Errorf("DELETE a bad name: HTTP %d, want 400", code)
	}

	if err := c.RestartServices(ctx); err != nil {
		t.Fatal(err)
	}
	if got := apiCounters(t, c, "show"); !maps.Equal(got, map[string]int64{"like": 4}) {
		t.Errorf("after the restart the API reads %v, want like 4", got)
	}
	if err := b.cl.AddCounter(ctx, "like", 2); err != nil {
		t.Fatal(err)
	}
	late := dialCounterMember(t, c, c.Nodes[1], "late", "show")
	waitTotals(t, append(members, late), map[string]int64{"like": 6})
}

// TestCounterWindowsPerRoom: 20 members of a room on one ChatLink tap five times a second
// each for two seconds; the ChatLink sends the room service at most one message per room per
// window (200 ms), and none once the taps stop.
func TestCounterWindowsPerRoom(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var windows, adds atomic.Int64
	sub, err := nc.Subscribe(bus.SubjectRoomCounters, func(m *nats.Msg) {
		var w buspb.CounterWindow
		if proto.Unmarshal(m.Data, &w) == nil && w.Room == "busy" {
			windows.Add(1)
			for _, a := range w.Adds {
				adds.Add(a.Total)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	var members []*counterMember
	for i := range 20 {
		members = append(members, dialCounterMember(t, c, c.Nodes[0], fmt.Sprintf("m%d", i), "busy"))
	}
	const duration = 2 * time.Second
	start := time.Now()
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for range 10 {
				if err := m.cl.AddCounter(ctx, "like", 1); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(duration / 10)
			}
		}()
	}
	wg.Wait()
	waitTotals(t, members[:1], map[string]int64{"like": 200})
	elapsed := time.Since(start)
	if got := adds.Load(); got != 200 {
		t.Errorf("the windows carried %d adds, want 200", got)
	}
	// One per window of the run at most, plus the window open as it ended.
	if got, most := windows.Load(), int64(elapsed/chatlink.DefaultCounterWindow)+1; got > most || got < 2 {
		t.Errorf("%d windows for 200 taps in %v, want 2 to %d (one per room and window at most)", got, elapsed.Round(time.Millisecond), most)
	} else {
		t.Logf("%d windows carried 200 taps in %v", got, elapsed.Round(time.Millisecond))
	}
	before := windows.Load()
	time.Sleep(3 * chatlink.DefaultCounterWindow)
	if after := windows.Load(); after != before {
		t.Errorf("%d windows sent with nothing added", after-before)
	}
}

// TestCountersLoad (not with -short): 1,000 members on two ChatLinks each tap a like twice a
// second for 10 s (2,000 likes a second, 20,000 in all). Every member ends with the total 20,000;
// each ChatLink sends the room service at most one message per window for the room (5 a
// second), and a member gets at most about four CounterTotals frames a second.
func TestCountersLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run")
	}
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	windows := make(map[string]*atomic.Int64)
	for _, n := range c.Nodes {
		windows[n.Name()] = new(atomic.Int64)
	}
	sub, err := nc.Subscribe(bus.SubjectRoomCounters, func(m *nats.Msg) {
		var w buspb.CounterWindow
		if proto.Unmarshal(m.Data, &w) == nil && w.Room == "arena" {
			windows[w.Node].Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	const (
		members  = 1000
		perSec   = 2
		duration = 10 * time.Second
	)
	var events atomic.Int64 // CounterEvents of member 0
	clients := make([]*sdk.Client, members)
	var wg sync.WaitGroup
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := c.Nodes[i%2]
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl, err := sdk.Dial(ctx, sdk.Config{
				Token:     testcluster.Token(t, fmt.Sprintf("v%d", i), "arena"),
				Endpoints: []sdk.Endpoint{{Node: node.Name(), WSURL: node.WSURL(), TCPAddr: node.TCPAddr()}},
				Transport: sdk.TransportTCP,
				OnEvent: func(e sdk.Event) {
					if _, ok := e.(*sdk.CounterEvent); ok && i == 0 {
						events.Add(1)
					}
				},
			})
			if err != nil {
				t.Errorf("member %d: %v", i, err)
				return
			}
			clients[i] = cl
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	start := time.Now()
	before := map[string]int64{}
	for n, w := range windows {
		before[n] = w.Load()
	}
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*duration)
			defer cancel()
			// Spread the members' taps over the period.
			time.Sleep(time.Duration(i) * time.Second / perSec / members)
			tick := time.NewTicker(time.Second / perSec)
			defer tick.Stop()
			for range int(duration.Seconds()) * perSec {
				if err := cl.AddCounter(ctx, "like", 1); err != nil {
					t.Errorf("member %d: %v", i, err)
					return
				}
				<-tick.C
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	want := int64(members * perSec * int(duration.Seconds()))
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for i, cl := range clients {
			if got, _ := cl.Counters(); got["like"] != want {
				return fmt.Errorf("member %d sees %d likes, want %d", i, got["like"], want)
			}
		}
		return nil
	})
	for n, w := range windows {
		sent := w.Load() - before[n]
		perSecond := float64(sent) / elapsed.Seconds()
		t.Logf("%s: %d windows in %v (%.1f a second)", n, sent, elapsed.Round(time.Millisecond), perSecond)
		if most := int64(elapsed/chatlink.DefaultCounterWindow) + 1; sent > most {
			t.Errorf("%s sent %d windows in %v, want at most %d", n, sent, elapsed, most)
		}
	}
	if ev, most := events.Load(), int64(elapsed.Seconds()*4)+8; ev > most {
		t.Errorf("member 0 got %d CounterEvents in %v, want at most %d", ev, elapsed, most)
	} else {
		t.Logf("member 0: %d CounterEvents in %v", ev, elapsed.Round(time.Millisecond))
	}
}

// TestCountersChatLinkShutdown: a ChatLink shut down right after its members tapped sends what
// it had summed before it stops: the totals hold every tap.
func TestCountersChatLinkShutdown(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := dialCounterMember(t, c, c.Nodes[0], "leaver", "closing")
	watcher := dialCounterMember(t, c, c.Nodes[1], "watcher", "closing")
	for range 7 {
		if err := m.cl.AddCounter(ctx, "like", 3); err != nil {
			t.Fatal(err)
		}
	}
	// The adds are written; a queue request's round trip (on the same connection, after
	// them) shows the node has read them.
	if _, _, err := m.cl.QueueList(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[0].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitTotals(t, []*counterMember{watcher}, map[string]int64{"like": 21})
	if got := apiCounters(t, c, "closing"); got["like"] != 21 {
		t.Errorf("the API reads %v, want like 21", got)
	}
}
