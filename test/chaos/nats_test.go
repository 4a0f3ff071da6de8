package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/procs"
)

// TestRestartNATSServer: kill -9 the NATS server with the most roomcast connections a third of
// the way into 8 s of 50 critical messages a second to a 2,000-member room, and start it again
// 3 s later. No critical message is lost or duplicated; every role is ready again (it
// reconnected); the restarted server is healthy (its JetStream caught up); and the ChatLinks'
// load reports resume: the dispatchers still list both nodes well after the restart.
func TestRestartNATSServer(t *testing.T) {
	d := start(t, procs.Config{})
	r := join(t, d, "stage", members)
	victim, most := 0, -1
	for i := range d.NATS.Servers {
		if n, err := d.NATS.Connections(i); err == nil && n > most {
			victim, most = i, n
		}
	}
	server := d.NATS.Servers[victim]
	t.Logf("killing %s (%d client connections)", server.Name, most)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var restartedAt time.Time
	err := r.send(ctx, total, rate, func(i int) {
		switch i {
		case total / 3:
			server.Kill()
		case total/3 + 3*rate:
			server.Start()
			restartedAt = time.Now()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	tl := r.await(t, total, 20*time.Second)
	tl.check(t)
	if tl.unrecovered > 0 {
		t.Errorf("%d recoveries incomplete", tl.unrecovered)
	}
	var healthy time.Duration
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		healthy = time.Since(restartedAt)
		return d.NATS.Healthy(victim)
	})
	roles := append(append(append([]*procs.Role{}, d.Services...), d.ChatLinks...), d.Pushers...)
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		for _, role := range roles {
			if err := role.Ready(); err != nil {
				return err
			}
		}
		return nil
	})
	// A node without reports is out after 3 s: both listed 5 s after the restart means reports flow.
	time.Sleep(time.Until(restartedAt.Add(5 * time.Second)))
	for _, s := range d.Services {
		nodes, err := dispatched(r.hc, s.API, r.name)
		if err != nil || len(nodes) != len(d.ChatLinks) {
			t.Errorf("%s dispatches to %v (%v), want both ChatLinks: load reports did not resume", s.Name, nodes, err)
		}
	}
	// The roles only reconnected: none exited.
	for _, role := range roles {
		select {
		case <-role.Exited():
			t.Errorf("%s exited", role.Name)
		default:
		}
	}
	record(t, fmt.Sprintf("%d members, %d critical msgs at %d/s; %s (%d connections) killed, restarted 3 s later: healthy %v after its restart, every role ready; sends refused and retried %d; critical lost %d, duplicated %d, in another order than the room's %d, room order departing from send order %d, incomplete recoveries %d",
		members, total, rate, server.Name, most, healthy.Round(10*time.Millisecond), r.retried.Load(), tl.lost, tl.duplicates, tl.disordered, tl.swapped, tl.unrecovered))
}
