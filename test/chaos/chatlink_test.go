package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"roomcast/internal/testkit/procs"
)

// Load of the ChatLink and NATS cases: a 2,000-member room receiving 50 critical messages a
// second for 8 s.
const (
	members  = 2000
	rate     = 50
	duration = 8 * time.Second
	total    = rate * int(duration/time.Second)
)

// TestKillChatLink: kill -9 the ChatLink most of a 2,000-member room is on, a third of the way
// into 8 s of 50 critical messages a second. Every member it had is back within 5 s through
// the dispatcher, every member has every message exactly once and in order with its recovery
// complete, and the dispatcher stops handing out the dead node once its missed load reports
// make it stale (3 s, plus a cached ranking's 1 s).
func TestKillChatLink(t *testing.T) {
	d := start(t, procs.Config{})
	r := join(t, d, "stage", members)
	on := r.on()
	victim := d.ChatLinks[0]
	for _, cl := range d.ChatLinks {
		if len(on[cl.Node]) > len(on[victim.Node]) {
			victim = cl
		}
	}
	moved := on[victim.Node]
	t.Logf("%d members on %s, %d elsewhere", len(moved), victim.Name, members-len(moved))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var killedAt time.Time
	// Ask both dispatchers every 50 ms, from the kill on, whether they still hand out the dead node.
	var lastSeen time.Time
	var watch sync.WaitGroup
	stopWatch := make(chan struct{})
	err := r.send(ctx, total, rate, func(i int) {
		if i != total/3 {
			return
		}
		victim.Kill()
		killedAt = time.Now()
		watch.Go(func() {
			for {
				select {
				case <-stopWatch:
					return
				case <-time.After(50 * time.Millisecond):
				}
				for _, s := range d.Services {
					if nodes, err := dispatched(r.hc, s.API, r.name); err == nil && slices.Contains(nodes, victim.Node) {
						lastSeen = time.Now()
					}
				}
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	tl := r.await(t, total, 20*time.Second)
	close(stopWatch)
	watch.Wait()

	var slowest time.Duration
	notBack := 0
	for _, m := range moved {
		m.mu.Lock()
		if m.reconnected.IsZero() {
			notBack++
		} else {
			slowest = max(slowest, m.reconnected.Sub(killedAt))
		}
		if m.recovered == 0 {
			t.Errorf("a member of %s was not told its recovery was complete", victim.Node)
		}
		m.mu.Unlock()
	}
	tl.check(t)
	if notBack > 0 || slowest > 5*time.Second {
		t.Errorf("%d of %d members of the dead node not back; the slowest back after %v (want 5 s)", notBack, len(moved), slowest)
	}
	if tl.unrecovered > 0 {
		t.Errorf("%d recoveries incomplete", tl.unrecovered)
	}
	handedOut := time.Duration(0)
	if !lastSeen.IsZero() {
		handedOut = lastSeen.Sub(killedAt)
	}
	if handedOut > 4*time.Second {
		t.Errorf("the dispatcher handed out the dead node %v after the kill (want at most 4 s)", handedOut)
	}
	record(t, fmt.Sprintf("%d members (%d on the killed node), %d critical msgs at %d/s: all back within %v; critical lost %d, duplicated %d, in another order than the room's %d, room order departing from send order %d, incomplete recoveries %d; dead node last handed out %v after the kill",
		members, len(moved), total, rate, slowest.Round(10*time.Millisecond), tl.lost, tl.duplicates, tl.disordered, tl.swapped, tl.unrecovered, handedOut.Round(10*time.Millisecond)))
}
