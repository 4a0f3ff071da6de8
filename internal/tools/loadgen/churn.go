package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// churnLife is how long a churning member (fanout --churn) stays in the room.
const churnLife = 2 * time.Second

// churnCounts is what churn did.
type churnCounts struct {
	logins, failed int64
	errs           []string
}

// churn logs cfg.Churn extra members a second into room until ctx ends, each leaving
// churnLife after its login, so that the room's member count changes all the time, as in a
// live show's audience: what the viewer counts cost is measured against that, their worst
// case (a count that holds still costs nothing). The members ask for the live state as
// cfg.LiveState says, read and drop what they receive, and count in no delivery figure. It
// returns once every one of them has left.
func churn(ctx context.Context, cfg Config, hc *http.Client, room string, run runID) churnCounts {
	var cc churnCounts
	if cfg.Churn <= 0 {
		return cc
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	every := time.Duration(float64(time.Second) / cfg.Churn)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return cc
		case <-tick.C:
		}
		wg.Go(func() {
			uid := fmt.Sprintf("bench-%x-churn-%d", run, i)
			err := churnOne(cfg, hc, room, uid)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				cc.failed++
				if len(cc.errs) < maxErrors {
					cc.errs = append(cc.errs, fmt.Sprintf("churn member %s: %v", uid, err))
				}
				return
			}
			cc.logins++
		})
	}
}

// churnOne logs member uid in, keeps it churnLife and closes it. Its login is not cut short
// when the run stops: every churning member that started stays its whole life.
func churnOne(cfg Config, hc *http.Client, room, uid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), rawLoginWait)
	defer cancel()
	c, err := dialExtra(ctx, cfg, hc, room, uid, func(int32, []byte) {}, rawHooks{liveState: cfg.LiveState})
	if err != nil {
		return err
	}
	time.Sleep(churnLife)
	if err := c.Err(); err != nil {
		_ = c.Close()
		return fmt.Errorf("dropped: %w", err)
	}
	return c.Close()
}
