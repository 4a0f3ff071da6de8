package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// LoginResult is what RunLogin measured. Its JSON is the `roomcast bench login --json` line.
type LoginResult struct {
	Scenario string `json:"scenario"` // "login"
	// Placement is where the bench and the server ran, and each server process's usage.
	Placement
	N         int     `json:"n"`
	Rooms     int     `json:"rooms"`
	Transport string  `json:"transport"`
	Workers   int     `json:"workers"`
	Rate      float64 `json:"rate"` // the pace asked for, logins per second
	OK        int64   `json:"ok"`
	Failed    int64   `json:"failed"`
	// Seconds runs from the first login's start to the last one's end; LoginsPerSec is OK
	// over it.
	Seconds      float64 `json:"seconds"`
	LoginsPerSec float64 `json:"logins_per_sec"`
	// Latency of one login: dispatch, connect and the LoginAck, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
	// ServerCPUSeconds is the server's CPU time over the logins (from the first login's start
	// to the last one's LoginAck); LoginsPerServerCPUSec is OK over it and ServerCPUMSPerLogin
	// its inverse, in milliseconds: what one login costs the whole server.
	ServerCPUSeconds      float64  `json:"server_cpu_seconds"`
	LoginsPerServerCPUSec float64  `json:"logins_per_server_cpu_sec"`
	ServerCPUMSPerLogin   float64  `json:"server_cpu_ms_per_login"`
	BenchCPUSeconds       float64  `json:"bench_cpu_seconds"`
	BenchMaxRSSBytes      int64    `json:"bench_max_rss_bytes"`
	Errors                []string `json:"errors,omitempty"`
}

// Passed reports whether every login succeeded.
func (r LoginResult) Passed() bool { return r.OK == int64(r.N) && r.Failed == 0 }

// String is the human summary.
func (r LoginResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "login: n=%d rate=%g/s rooms=%d transport=%s workers=%d\n", r.N, r.Rate, r.Rooms, r.Transport, r.Workers)
	fmt.Fprintf(&b, "  logins      %d ok, %d failed in %.2fs: %.0f logins/s (server %.2f CPU-s)\n", r.OK, r.Failed, r.Seconds, r.LoginsPerSec, r.ServerCPUSeconds)
	fmt.Fprintf(&b, "  server cost %.0f logins per server CPU-second, %.3f ms of server CPU a login\n", r.LoginsPerServerCPUSec, r.ServerCPUMSPerLogin)
	fmt.Fprintf(&b, "  latency     p50 %.1fms  p99 %.1fms  max %.1fms  (dispatch + connect + LoginAck)\n", r.P50MS, r.P99MS, r.MaxMS)
	fmt.Fprintf(&b, "  bench       %.1f CPU-s, peak RSS %.0f MiB", r.BenchCPUSeconds, float64(r.BenchMaxRSSBytes)/(1<<20))
	b.WriteString("\n" + r.Placement.summary())
	return b.String()
}

// RunLogin starts cfg.N logins paced at cfg.Rate per second, each a dispatch, a connection and
// a login answered by a LoginAck, and reports their rate and latency; then it closes them. The
// result is filled in as far as the run got, also with an error.
func RunLogin(ctx context.Context, cfg Config) (LoginResult, error) {
	cfg, err := cfg.withDefaults()
	res := LoginResult{Scenario: "login", N: cfg.N, Rooms: cfg.Rooms, Transport: cfg.Transport, Rate: cfg.Rate}
	if err != nil {
		return res, err
	}
	if cfg.Rate <= 0 {
		return res, errors.New("bench: login needs a positive rate")
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
	if err := r.start("login", cfg.Rate, 16); err != nil {
		return res, err
	}
	res.Workers = len(r.workers)
	if err := r.connect(ctx, "logins"); err != nil {
		return res, err
	}
	after, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}
	rep, err := r.finish(ctx, nil, 0)
	if err != nil {
		return res, err
	}
	res.OK, res.Failed = rep.Connected, rep.Failed
	if rep.LoginEnd > rep.LoginStart {
		res.Seconds = time.Duration(rep.LoginEnd - rep.LoginStart).Seconds()
		res.LoginsPerSec = float64(res.OK) / res.Seconds
	}
	res.P50MS, res.P99MS, res.MaxMS = quantiles(rep.LoginLatency)
	res.ServerCPUSeconds = after.cpu - before.cpu
	res.Placement = r.placement(before, after)
	if res.ServerCPUSeconds > 0 && res.OK > 0 {
		res.LoginsPerServerCPUSec = float64(res.OK) / res.ServerCPUSeconds
		res.ServerCPUMSPerLogin = res.ServerCPUSeconds * 1000 / float64(res.OK)
	}
	res.BenchCPUSeconds, res.BenchMaxRSSBytes = rep.CPUSeconds, rep.MaxRSSBytes
	res.Errors = rep.Errors
	return res, nil
}
