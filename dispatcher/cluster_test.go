package dispatcher_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
)

// A room's members joining through the dispatcher, with the Go SDK, over four real ChatLinks
// that report what they hold while the crowd arrives: with a node's capacity at the room's
// size and RoomShare 0.5, the room needs two nodes and ends on two, evenly. 4,000 members;
// 400 under -short.
func TestRoomOverChatLinks(t *testing.T) {
	t.Parallel()
	members, parallel := 4000, 32
	if testing.Short() {
		members, parallel = 400, 8
	}
	c := testcluster.Start(t, testcluster.ChatLinks(4), func(cfg *devcluster.Config) {
		cfg.LeaseInterval = 500 * time.Millisecond // several reports while the crowd arrives
		cfg.ChatLink.MaxConnections = members
		// Nodes that start a moment after the dispatcher are not new nodes to warm up.
		cfg.Dispatcher.SlowStart = -1
	})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: parallel}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	var clients []*sdk.Client
	defer func() {
		for _, cl := range clients {
			_ = cl.Close()
		}
	}()
	perNode := map[string]int{}
	join := func(from, to int) {
		t.Helper()
		var wg sync.WaitGroup
		sem := make(chan struct{}, parallel)
		errs := make(chan error, to-from)
		for i := from; i < to; i++ {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				cl, err := sdk.Dial(ctx, sdk.Config{
					Token: testcluster.Token(t, fmt.Sprintf("u%d", i), "big"), Dispatcher: c.URL(),
					HTTPClient: hc, NoReconnect: true,
				})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				defer mu.Unlock()
				clients = append(clients, cl)
				perNode[cl.LoginAck().Node]++
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	// The crowd arrives in waves with a round of load reports between them, so the room's
	// later members are steered by what the nodes report they hold, not only by what the
	// dispatcher sent since.
	const waves = 4
	for w := range waves {
		join(w*members/waves, (w+1)*members/waves)
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			for _, info := range c.Dispatcher.Nodes(netip.Addr{}) {
				mu.Lock()
				want := perNode[info.Node]
				mu.Unlock()
				if info.Report.Connections != int64(want) || info.Assigned != 0 {
					return fmt.Errorf("node %s reports %d connections (%d sent since), has %d", info.Node, info.Report.Connections, info.Assigned, want)
				}
			}
			return nil
		})
	}
	counts := make([]int, 0, len(perNode))
	for _, n := range perNode {
		counts = append(counts, n)
	}
	if len(counts) != 2 {
		t.Fatalf("%d members on %d nodes %v, want 2 (the room's limit is half a node)", members, len(counts), perNode)
	}
	if hi, lo := slices.Max(counts), slices.Min(counts); float64(hi) > 1.2*float64(lo) {
		t.Fatalf("busiest node %d > 1.2 x least %d: %v", hi, lo, perNode)
	}
	for _, n := range c.Nodes {
		if got := n.Connections(); got != perNode[n.Name()] {
			t.Fatalf("node %s has %d connections, the logins say %d", n.Name(), got, perNode[n.Name()])
		}
	}
	t.Logf("%d members: %v", members, perNode)
}
