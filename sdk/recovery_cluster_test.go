package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
	"roomcast/store/historystore"
)

// apiSend sends a critical message with body to room through the server API.
func apiSend(ctx context.Context, c *devcluster.Cluster, room, body string) error {
	return apiJSON(ctx, c, http.MethodPost, "/v1/rooms/"+room+"/messages", map[string]string{"type": "notice", "lane": "critical", "body": body}, nil)
}

// numbered returns "0", "1", ... "n-1".
func numbered(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// TestClusterClientsSurviveTheirChatLink: clients receive 50 critical messages a second while
// the ChatLink most of them are on is killed (or drained). Every client is back within 5 s,
// has every message exactly once and in order, and was told its recovery was complete.
func TestClusterClientsSurviveTheirChatLink(t *testing.T) {
	clients, seconds := 100, 3
	if testing.Short() {
		clients, seconds = 20, 2
	}
	for _, stop := range []string{"kill", "drain"} {
		t.Run(stop, func(t *testing.T) {
			testSurvive(t, stop, clients, seconds)
		})
	}
}

func testSurvive(t *testing.T, stop string, clients, seconds int) {
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	const room, rate = "stage", 50
	total := rate * seconds
	recs := make([]*recorder, clients)
	cls := make([]*sdk.Client, clients)
	var wg sync.WaitGroup
	for i := range clients {
		recs[i] = newRecorder()
		wg.Go(func() {
			cls[i] = dialCluster(t, c, sdk.TransportWebSocket, fmt.Sprintf("viewer-%d", i), room, recs[i].config(sdk.Config{
				ReconnectMinDelay: 200 * time.Millisecond, ReconnectMaxDelay: time.Second,
			}))
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Stop the node most clients are on.
	on := map[string][]int{}
	for i, cl := range cls {
		on[cl.LoginAck().GetNode()] = append(on[cl.LoginAck().GetNode()], i)
	}
	victim := c.Nodes[0]
	if len(on[c.Nodes[1].Name()]) > len(on[victim.Name()]) {
		victim = c.Nodes[1]
	}
	moved := on[victim.Name()]
	t.Logf("%d clients on %s, %d on the other", len(moved), victim.Name(), clients-len(moved))

	// 50 critical messages a second; the node stops a third of the way in.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := range total {
			<-tick.C
			if err := apiSend(ctx, c, room, strconv.Itoa(i)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(time.Duration(seconds) * time.Second / 3) // a third of the stream before the stop
	stoppedAt := time.Now()
	var drained sync.WaitGroup
	switch stop {
	case "kill":
		victim.Kill()
	case "drain":
		drained.Go(func() {
			if err := victim.Drain(ctx, time.Second); err != nil {
				t.Errorf("drain: %v", err)
			}
		})
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	drained.Wait()

	want := numbered(total)
	testkit.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		for i, r := range recs {
			if got := r.bodies(); len(got) < total {
				return fmt.Errorf("client %d has %d of %d messages", i, len(got), total)
			}
		}
		return nil
	})
	for i, r := range recs {
		if got := r.bodies(); !slices.Equal(got, want) {
			t.Errorf("client %d: %d messages, not each of the %d once and in order: %v", i, len(got), total, got)
		}
	}
	for _, i := range moved {
		r := recs[i]
		_, back, ok := r.firstAt(func(ev sdk.Event) bool {
			e, ok := ev.(*sdk.ConnectedEvent)
			return ok && e.Reconnected
		})
		if !ok || back.Sub(stoppedAt) > 5*time.Second {
			t.Errorf("client %d not back within 5 s of the %s (back %v after): %q", i, stop, back.Sub(stoppedAt), r.order())
			continue
		}
		recovered := all[*sdk.RecoveredEvent](r)
		if len(recovered) == 0 || slices.ContainsFunc(recovered, func(e *sdk.RecoveredEvent) bool { return !e.Recovered }) {
			t.Errorf("client %d: recovered events %+v, want recovered: true", i, recovered)
		}
	}
}

// historyHas waits until the room's history holds its message number seq.
func historyHas(t *testing.T, c *devcluster.Cluster, room string, seq uint64) {
	t.Helper()
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		kept, _, err := historystore.Read(ctx, js, devcluster.App, room, historystore.Range{})
		if err != nil {
			return err
		}
		if len(kept) == 0 || kept[len(kept)-1].Msg.RoomSeq < seq {
			return fmt.Errorf("history of %d messages, want it up to room_seq %d", len(kept), seq)
		}
		return nil
	})
}

// TestClusterRecoveryGapLargerThanHistory: with 10 messages kept per room, a client cut off
// while 30 are sent recovers the 10 kept and is told that 20 are missing.
func TestClusterRecoveryGapLargerThanHistory(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.Room.HistoryPerRoom = 10 })
	const room = "short-memory"
	var (
		outage atomic.Bool
		mu     sync.Mutex
		conns  []net.Conn
	)
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if outage.Load() {
			return nil, errors.New("network down (test)")
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
		return nc, err
	}
	rec := newRecorder()
	dialCluster(t, c, sdk.TransportTCP, "commuter", room, rec.config(sdk.Config{
		Dialer: dialer, ReconnectMinDelay: 50 * time.Millisecond, ReconnectMaxDelay: 200 * time.Millisecond,
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		if err := apiSend(ctx, c, room, strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := len(rec.bodies()); n < 5 {
			return fmt.Errorf("%d of 5 messages before the outage", n)
		}
		return nil
	})

	// The network goes away; 30 messages are sent meanwhile, of which the room keeps 10.
	outage.Store(true)
	mu.Lock()
	for _, nc := range conns {
		_ = nc.Close()
	}
	mu.Unlock()
	for i := 5; i < 35; i++ {
		if err := apiSend(ctx, c, room, strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	historyHas(t, c, room, 35)
	outage.Store(false)

	got := waitFor[*sdk.RecoveredEvent](t, rec, 10*time.Second)
	if got.Recovered || got.Missing != 20 || got.Count != 10 {
		t.Errorf("recovered event %+v, want recovered: false, missing: 20, count: 10", got)
	}
	want := append(numbered(5), numbered(35)[25:]...)
	if bodies := rec.bodies(); !slices.Equal(bodies, want) {
		t.Errorf("messages %v, want %v", bodies, want)
	}
	if r := all[*sdk.ReconnectingEvent](rec); len(r) == 0 {
		t.Error("no reconnecting event after the connection dropped")
	}
}
