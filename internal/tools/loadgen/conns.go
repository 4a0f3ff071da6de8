package loadgen

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// ConnsResult is what RunConns measured. Its JSON is the `roomcast bench conns --json` line.
type ConnsResult struct {
	Scenario string `json:"scenario"` // "conns"
	// Placement is where the bench and the server ran, and each server process's usage.
	Placement
	N         int    `json:"n"`
	Rooms     int    `json:"rooms"`
	Transport string `json:"transport"`
	Workers   int    `json:"workers"` // processes holding the clients; 1 is this one
	Connected int64  `json:"connected"`
	Failed    int64  `json:"failed"`
	// Disconnected counts connections that ended while idle, before the bench closed them.
	Disconnected int64 `json:"disconnected"`
	// ConnectSeconds is how long the N logins took, ConnectsPerSec their rate.
	ConnectSeconds float64 `json:"connect_seconds"`
	ConnectsPerSec float64 `json:"connects_per_sec"`
	// SettleSeconds is how long the bench waited after the logins for RSS to settle.
	SettleSeconds float64 `json:"settle_seconds"`
	// RSSBeforeBytes and RSSAfterBytes are the server's RSS before connecting and after
	// settling; RSSPerConnBytes is their difference over the connected clients.
	RSSBeforeBytes  float64 `json:"rss_before_bytes"`
	RSSAfterBytes   float64 `json:"rss_after_bytes"`
	RSSPerConnBytes float64 `json:"rss_per_conn_bytes"`
	// ServerConnections is the server's own count of connections after settling (the
	// roomcast_chatlink_connections gauges summed), when it exposes it.
	ServerConnections float64 `json:"server_connections"`
	// Where the growth went, per connection, from the Go runtime's metrics when the server
	// exports them: heap in use, goroutine stacks in use, goroutines.
	HeapPerConnBytes  float64 `json:"heap_per_conn_bytes"`
	StackPerConnBytes float64 `json:"stack_per_conn_bytes"`
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
	// BenchCPUSeconds and BenchMaxRSSBytes are the bench's own usage, worker processes
	// included (their peak RSS added up).
	BenchCPUSeconds  float64  `json:"bench_cpu_seconds"`
	BenchMaxRSSBytes int64    `json:"bench_max_rss_bytes"`
	Errors           []string `json:"errors,omitempty"`
}

// OK reports whether every client logged in and stayed connected.
func (r ConnsResult) OK() bool {
	return r.Connected == int64(r.N) && r.Failed == 0 && r.Disconnected == 0
}

// String is the human summary.
func (r ConnsResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "conns: n=%d rooms=%d transport=%s workers=%d connected=%d failed=%d disconnected=%d\n",
		r.N, r.Rooms, r.Transport, r.Workers, r.Connected, r.Failed, r.Disconnected)
	fmt.Fprintf(&b, "  logins      %.1fs (%.0f/s), settled after %.1fs\n", r.ConnectSeconds, r.ConnectsPerSec, r.SettleSeconds)
	fmt.Fprintf(&b, "  server RSS  %.1f MiB -> %.1f MiB: %.0f bytes per connection (%.2f KiB)\n",
		r.RSSBeforeBytes/(1<<20), r.RSSAfterBytes/(1<<20), r.RSSPerConnBytes, r.RSSPerConnBytes/1024)
	if r.HeapPerConnBytes != 0 || r.StackPerConnBytes != 0 {
		fmt.Fprintf(&b, "  per conn    heap %.0f B, stacks %.0f B, %.2f goroutines (Go runtime metrics)\n",
			r.HeapPerConnBytes, r.StackPerConnBytes, r.GoroutinesPerConn)
	}
	fmt.Fprintf(&b, "  bench       %.1f CPU-s, peak RSS %.0f MiB", r.BenchCPUSeconds, float64(r.BenchMaxRSSBytes)/(1<<20))
	b.WriteString("\n" + r.Placement.summary())
	return b.String()
}

// settleMin is how long RunConns waits at least after the logins before it reads RSS: the
// server is still finishing the joins' work (presence, room counts) and its GC has not run.
const settleMin = 3 * time.Second

// RunConns logs cfg.N idle members in, waits for the server's RSS to settle, and reports its
// growth per connection. The result is filled in as far as the run got, also with an error.
func RunConns(ctx context.Context, cfg Config) (ConnsResult, error) {
	cfg, err := cfg.withDefaults()
	res := ConnsResult{Scenario: "conns", N: cfg.N, Rooms: cfg.Rooms, Transport: cfg.Transport}
	if err != nil {
		return res, err
	}
	r, err := newRunner(cfg)
	defer r.stop()
	if err != nil {
		return res, err
	}
	before, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}
	res.RSSBeforeBytes = before.rss

	if err := r.start("conns", 0, 16); err != nil {
		return res, err
	}
	res.Workers = len(r.workers)
	t0 := time.Now()
	if err := r.connect(ctx, "logged in"); err != nil {
		return res, err
	}
	res.ConnectSeconds = time.Since(t0).Seconds()
	st := r.status()
	res.Connected, res.Failed = st.Connected, st.Failed
	res.ConnectsPerSec = float64(st.Connected) / max(res.ConnectSeconds, 1e-9)

	after, settled, err := r.settle(ctx, before.rss)
	res.SettleSeconds = settled.Seconds()
	if err != nil {
		return res, err
	}
	res.RSSAfterBytes, res.ServerConnections = after.rss, after.conns
	res.Placement = r.placement(before, after)
	if n := float64(res.Connected); n > 0 {
		res.RSSPerConnBytes = math.Round((after.rss - before.rss) / n)
		res.HeapPerConnBytes = math.Round((after.heapInuse - before.heapInuse) / n)
		res.StackPerConnBytes = math.Round((after.stackInuse - before.stackInuse) / n)
		res.GoroutinesPerConn = math.Round((after.goroutines-before.goroutines)/n*100) / 100
	}

	if cfg.Hold > 0 {
		r.progress("holding %d members for %v", res.Connected, cfg.Hold)
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(cfg.Hold):
		}
	}
	rep, err := r.finish(ctx, nil, 0)
	if err != nil {
		return res, err
	}
	res.Disconnected = rep.Disconnected
	res.Errors = rep.Errors
	res.BenchCPUSeconds, res.BenchMaxRSSBytes = rep.CPUSeconds, rep.MaxRSSBytes
	return res, nil
}

// settle waits at least settleMin, then until two readings of the server's RSS a second
// apart differ by less than 1% of its growth (or 64 KiB), or cfg.Settle has passed.
func (r *runner) settle(ctx context.Context, base float64) (serverStats, time.Duration, error) {
	start := time.Now()
	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := wait(settleMin - time.Second); err != nil {
		return serverStats{}, time.Since(start), err
	}
	prev, err := r.server.read(ctx)
	if err != nil {
		return prev, time.Since(start), err
	}
	for {
		if err := wait(time.Second); err != nil {
			return prev, time.Since(start), err
		}
		cur, err := r.server.read(ctx)
		if err != nil {
			return cur, time.Since(start), err
		}
		st := r.status()
		r.progress("settling: server RSS %.1f MiB (%+.1f MiB since the last second), %d connected",
			cur.rss/(1<<20), (cur.rss-prev.rss)/(1<<20), st.Connected)
		growth := max(cur.rss-base, 0)
		if math.Abs(cur.rss-prev.rss) <= max(0.01*growth, 64<<10) || time.Since(start) >= r.cfg.Settle {
			return cur, time.Since(start), nil
		}
		prev = cur
	}
}
