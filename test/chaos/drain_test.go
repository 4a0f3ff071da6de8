package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"roomcast/internal/testkit/procs"
)

// TestRollingDrain: a rolling restart of both ChatLinks under a 2,000-member room receiving 50
// critical messages a second: each in turn is drained with `roomcast drain --spread 2s`, exits,
// is started again and is ready before the next. Members see reconnects and no error, and every
// member has every critical message exactly once, in order.
func TestRollingDrain(t *testing.T) {
	d := start(t, procs.Config{})
	r := join(t, d, "stage", members)
	const spread = 2 * time.Second
	const seconds = 20
	total := rate * seconds

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restarted := make(chan error, 1)
	var drainTook []time.Duration
	go func() {
		time.Sleep(2 * time.Second)
		for _, cl := range d.ChatLinks {
			began := time.Now()
			out, err := exec.CommandContext(ctx, d.Bin.Roomcast, "drain", "--nats", d.NATS.URL(), "--node", cl.Node, "--spread", spread.String()).CombinedOutput()
			if err != nil {
				restarted <- fmt.Errorf("roomcast drain %s: %v\n%s", cl.Node, err, out)
				return
			}
			select {
			case <-cl.Exited():
			case <-time.After(spread + 30*time.Second):
				restarted <- fmt.Errorf("%s did not exit after its drain", cl.Node)
				return
			}
			drainTook = append(drainTook, time.Since(began).Round(10*time.Millisecond))
			cl.Start()
			for cl.Ready() != nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
		restarted <- nil
	}()
	if err := r.send(ctx, total, rate, func(int) {}); err != nil {
		t.Fatal(err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	tl := r.await(t, total, 20*time.Second)
	tl.check(t)
	reconnects, withErrors := 0, 0
	for _, m := range r.members {
		m.mu.Lock()
		reconnects += m.reconnects
		if len(m.errs) > 0 {
			if withErrors++; withErrors <= 3 {
				t.Errorf("a member saw errors: %v", m.errs)
			}
		}
		m.mu.Unlock()
	}
	if reconnects < members {
		t.Errorf("%d reconnects of %d members: the drains moved fewer than every member", reconnects, members)
	}
	record(t, fmt.Sprintf("%d members, %d critical msgs at %d/s; edge-1 then edge-2 drained (spread %v), restarted: drains took %v; reconnects %d, members with errors %d; critical lost %d, duplicated %d, in another order than the room's %d, room order departing from send order %d, incomplete recoveries %d",
		members, total, rate, spread, drainTook, reconnects, withErrors, tl.lost, tl.duplicates, tl.disordered, tl.swapped, tl.unrecovered))
}
