package chaos

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/testkit/procs"
)

// leaseTTL is presence's default lease (presence.Config.LeaseTTL): how long counts may lag.
const leaseTTL = 5 * time.Second

// counts asks the services process at api for the room's members online (the room service's
// GetRoom) and the app's sessions online (presence's CountOnline).
func (r *room) counts(ctx context.Context, api string) (online, sessions int, err error) {
	var room struct{ Online int }
	if err := apiJSON(ctx, r.hc, api, "GET", "/v1/rooms/"+r.name, "", &room); err != nil {
		return 0, 0, err
	}
	var app struct{ Sessions int }
	if err := apiJSON(ctx, r.hc, api, "GET", "/v1/online", "", &app); err != nil {
		return 0, 0, err
	}
	return room.Online, app.Sessions, nil
}

// TestKillServices: kill -9 one of the two services processes (an instance of the room
// service, presence, the dispatcher and the server API) while members keep logging in (20 a
// second) and the API is asked every 50 ms. The other instance answers every call, every login
// succeeds, and both its counts (GetRoom's online, CountOnline's sessions) equal the members
// online within the lease (5 s) of the last login; the killed instance, started again, agrees
// within the lease of being ready.
func TestKillServices(t *testing.T) {
	d := start(t, procs.Config{})
	const first, joining, perSecond = 500, 100, 20
	r := join(t, d, "stage", first)
	victim, survivor := d.Services[1], d.Services[0]

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var apiCalls, apiErrors atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			apiCalls.Add(1)
			if _, _, err := r.counts(ctx, survivor.API); err != nil {
				if apiErrors.Add(1) <= 3 {
					t.Errorf("API: %v", err)
				}
			}
		}
	})
	loginErrors := 0
	tick := time.NewTicker(time.Second / perSecond)
	for i := range joining {
		<-tick.C
		if i == joining/3 {
			victim.Kill()
		}
		m := &member{}
		if err := r.dial(ctx, t, m, fmt.Sprintf("late-%d", i)); err != nil {
			if loginErrors++; loginErrors <= 3 {
				t.Errorf("login %d: %v", i, err)
			}
			continue
		}
		r.members = append(r.members, m)
	}
	tick.Stop()
	lastLogin := time.Now()
	close(stop)
	wg.Wait()

	converge := func(api string, since time.Time) time.Duration {
		want := len(r.members)
		var online, sessions int
		var err error
		for time.Since(since) < 3*leaseTTL {
			if online, sessions, err = r.counts(ctx, api); err == nil && online == want && sessions == want {
				return time.Since(since)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("%s counts %d online, %d sessions (%v), want %d: not converged after %v", api, online, sessions, err, want, 3*leaseTTL)
		return -1
	}
	survivorLag := converge(survivor.API, lastLogin)
	victim.Start()
	d.WaitReady(t, victim)
	restartedLag := converge(victim.API, time.Now())
	for what, lag := range map[string]time.Duration{"survivor": survivorLag, "restarted": restartedLag} {
		if lag > leaseTTL {
			t.Errorf("the %s's counts took %v to converge, want the lease's %v", what, lag, leaseTTL)
		}
	}
	record(t, fmt.Sprintf("%s killed while %d members logged in at %d/s to a room of %d: API calls to the other %d, failed %d; logins failed %d; counts converged %v after the last login; the restarted instance's %v after it was ready",
		victim.Name, joining, perSecond, first, apiCalls.Load(), apiErrors.Load(), loginErrors, survivorLag.Round(10*time.Millisecond), restartedLag.Round(10*time.Millisecond)))
}
