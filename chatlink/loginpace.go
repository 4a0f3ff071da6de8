package chatlink

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"roomcast/internal/ratelimit"
)

// limitLoginNode names the node's login pacing in roomcast_chatlink_limited_total: a login
// refused because the queue of logins waiting for the pace was full.
const limitLoginNode = "login_node"

// loginPacer spreads the logins a node processes over time, whatever their source
// (Limits.LoginRate). When a node dies its clients all come back within a second or two; a
// node that took them as fast as they came would have thousands of logins runnable at once
// (token checks, joins, their replies), and the fan-out to the members it already holds would
// wait behind them in the Go scheduler's run queue. Paced, a login frame that finds no token
// waits for one, the connection open and nothing else done for it, in arrival order; at most
// Limits.LoginQueue wait, and one more is refused with a retry hint of the time the queue
// takes to drain. The pace runs on the real clock, since it makes logins wait in real time.
type loginPacer struct {
	limit    ratelimit.Limit
	maxQueue int
	bucket   *rate.Limiter // nil when the pace is off

	mu      sync.Mutex // guards waiting; a reservation and the queue's check are one step under it
	waiting int        // logins holding a reservation, not yet due

	// slots bounds the logins past the pace at once (Limits.LoginConcurrency): a send on it
	// takes one, a receive gives it back. Nil when unbounded.
	slots chan struct{}
	busy  prometheus.GaugeFunc // len(slots), read at each scrape

	queue  prometheus.GaugeFunc // waiting, read at each scrape
	queued prometheus.Counter   // logins that had to wait
	waits  prometheus.Histogram
}

func newLoginPacer(lim Limits) *loginPacer {
	p := &loginPacer{
		limit: lim.LoginRate,
		queued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_logins_paced_total", Help: "Logins that waited for the node's login pace before they were processed.",
		}),
		waits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "roomcast_chatlink_login_pace_wait_seconds", Help: "How long the logins that waited for the node's login pace waited.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 4, 8},
		}),
	}
	p.queue = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "roomcast_chatlink_login_queue", Help: "Logins waiting for the node's login pace (--login-rate).",
	}, func() float64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		return float64(p.waiting)
	})
	p.busy = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "roomcast_chatlink_login_slots_busy", Help: "Logins past the node's login pace now, of at most --login-concurrency.",
	}, func() float64 { return float64(len(p.slots)) })
	if n := lim.LoginConcurrency; n > 0 {
		p.slots = make(chan struct{}, n)
	}
	if lim.LoginRate.Off() {
		return p
	}
	p.maxQueue = lim.LoginQueue
	if p.maxQueue <= 0 {
		p.maxQueue = int(3 * lim.LoginRate.Rate)
	}
	p.bucket = rate.NewLimiter(rate.Limit(lim.LoginRate.Rate), max(1, lim.LoginRate.Burst))
	return p
}

func (p *loginPacer) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.queue, p.queued, p.waits, p.busy}
}

// wait returns when the login may be processed, true; or false at once with a retry hint
// when the queue is full, or when ctx ends while it waits (retry zero).
func (p *loginPacer) wait(ctx context.Context) (ok bool, retry time.Duration) {
	if p.bucket == nil {
		return true, 0
	}
	now := time.Now()
	p.mu.Lock()
	r := p.bucket.ReserveN(now, 1)
	delay := r.DelayFrom(now)
	if delay == 0 {
		p.mu.Unlock()
		return true, 0
	}
	if waiting := p.waiting; waiting >= p.maxQueue {
		r.CancelAt(now)
		p.mu.Unlock()
		// The queue drains at the pace: come back when it has, the SDKs add their jitter.
		return false, time.Duration(float64(waiting) / p.limit.Rate * float64(time.Second))
	}
	p.waiting++
	p.mu.Unlock()
	p.queued.Inc()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		ok = true
	case <-ctx.Done():
	}
	p.mu.Lock()
	p.waiting--
	p.mu.Unlock()
	p.waits.Observe(time.Since(now).Seconds())
	return ok, 0
}

// enter waits, in arrival order, while ctx lasts and for at most most, for one of the slots of
// the logins past the pace, and reports whether it got one; leave gives it back.
//
// The pace bounds how many logins start a second, not how many run at once: on a node short of
// CPU (a reconnect storm on a machine that is busy with more than the node) its logins finish
// later than they start, and those in progress pile up in the Go scheduler's run queue, woken
// by their requests' answers, with the room fan-out's goroutines behind them at every hop. A
// bound on the logins in progress keeps that queue short and lets the logins slow down with the
// node: in TestReconnectStorm at 15,000 clients, 64 slots kept the survivor's members within 2x
// of their quiet p99 in 7 of 7 runs, against 2 of 6 without. It also holds logins to the
// bound's number in flight while they wait on the services, so logins take longer where those
// answer slowly (docs/reliability.md). DefaultLimits sets 64.
func (p *loginPacer) enter(ctx context.Context, most time.Duration) bool {
	if p.slots == nil {
		return true
	}
	select {
	case p.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(most)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

func (p *loginPacer) leave() {
	if p.slots != nil {
		<-p.slots
	}
}
