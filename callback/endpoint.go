package callback

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"roomcast/tag"
)

// endpoint is one hook of one app: its URL, its bounded pool of calls and its breaker. Each
// endpoint is apart from the others, so a dead send hook does not stop the same app's logins.
type endpoint struct {
	c    *Client
	app  string
	hook Hook
	url  string
	cfg  AppConfig
	brk  *breaker
	m    endpointMetrics
	log  *slog.Logger

	mu      sync.Mutex // guards the fields below
	running int        // calls in flight, at most cfg.MaxConcurrent
	queue   []job      // calls waiting for a free slot, at most cfg.MaxQueued
}

// job is one call waiting or in flight.
type job struct {
	body   func(id string, now time.Time) any // the request, stamped when it goes out
	done   func(Decision)
	queued time.Time
	probe  bool  // the breaker let it through as a half-open probe
	lane   int32 // a send's lane, which the answer may lower and not raise
}

func (c *Client) newEndpoint(app string, hook Hook, url string, a AppConfig) *endpoint {
	e := &endpoint{c: c, app: app, hook: hook, url: url, cfg: a, m: c.m.forEndpoint(app, hook)}
	e.log = c.cfg.Log.With("svc", "callback", "app", app, "hook", string(hook))
	e.brk = newBreaker(a.Breaker, func(from, to breakerState) {
		e.m.state.Set(float64(to))
		e.log.Warn("callback breaker "+to.String(), "was", from.String())
	})
	e.m.state.Set(float64(stateClosed))
	return e
}

// submit starts j, queues it, or decides it at once by the failure policy: when the breaker is
// open, or when the pool and its queue are full.
func (e *endpoint) submit(j job) {
	ok, probe := e.brk.allow(e.c.cfg.Now())
	if !ok {
		e.m.shortCircuited.Inc()
		e.fail(FailBreakerOpen, j.done)
		return
	}
	j.probe = probe
	e.mu.Lock()
	switch {
	case e.running < e.cfg.MaxConcurrent:
		e.running++
		e.mu.Unlock()
		e.c.wg.Add(1)
		go e.work(j)
	case len(e.queue) < e.cfg.MaxQueued:
		e.queue = append(e.queue, j)
		e.mu.Unlock()
	default:
		e.mu.Unlock()
		e.brk.forget(probe)
		e.m.rejectedFull.Inc()
		e.fail(FailRejected, j.done)
	}
}

// work makes j's call, then the queued ones, until the queue is empty. A queued call that
// waited longer than MaxWait is not made: its caller has likely given up.
func (e *endpoint) work(j job) {
	defer e.c.wg.Done()
	for {
		if e.c.cfg.Now().Sub(j.queued) > e.cfg.MaxWait {
			e.brk.forget(j.probe)
			e.m.rejectedWait.Inc()
			e.fail(FailRejected, j.done)
		} else {
			e.run(j)
		}
		e.mu.Lock()
		if len(e.queue) == 0 {
			e.running--
			e.mu.Unlock()
			return
		}
		j = e.queue[0]
		e.queue[0] = job{}
		e.queue = e.queue[1:]
		e.mu.Unlock()
	}
}

// run makes one call and hands its decision on.
func (e *endpoint) run(j job) {
	a, failure := e.call(j)
	if failure == FailTimeout && e.c.ctx.Err() != nil {
		failure = FailClosing // cut short by Close: not the app's fault
		e.brk.forget(j.probe)
	} else {
		e.brk.record(j.probe, failure == "", e.c.cfg.Now())
	}
	if failure != "" {
		if failure != FailClosing {
			e.m.failures.WithLabelValues(failure).Inc()
		}
		e.fail(failure, j.done)
		return
	}
	d := Decision{Allow: *a.Allow, Reason: a.Reason}
	if d.Allow {
		d.Tags, d.Body, d.Type, d.Lane = a.Tags, a.Body, a.Type, a.Lane
		e.m.decisions.WithLabelValues("allow").Inc()
	} else {
		e.m.decisions.WithLabelValues("deny").Inc()
	}
	j.done(d)
}

// fail decides a call that got no answer by the hook's failure policy.
func (e *endpoint) fail(kind string, done func(Decision)) {
	open := e.cfg.policy(e.hook) == FailOpen
	if open {
		e.m.decisions.WithLabelValues("fail_open").Inc()
	} else {
		e.m.decisions.WithLabelValues("fail_closed").Inc()
	}
	done(Decision{Allow: open, Failure: kind})
}

// checkTags refuses tags a member may not have, as a token's are refused.
func checkTags(tags []string) error {
	if err := tag.Validate(tags); err != nil {
		return fmt.Errorf("%w: %w", errAnswer, err)
	}
	return nil
}
