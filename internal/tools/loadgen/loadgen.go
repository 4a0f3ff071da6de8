package loadgen

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"roomcast/sdk"
)

// Config says what to benchmark and how. Target fields are shared by every scenario; the
// rest are read by the scenarios that name them.
type Config struct {
	// Dispatcher is the dispatcher's base URL, e.g. "http://127.0.0.1:8080". Required.
	Dispatcher string
	// API is the server API's base URL. Zero value means Dispatcher.
	API string
	// APIKey authenticates the server API requests (fanout). Required for fanout.
	APIKey string
	// Metrics is the URL of the server's Prometheus metrics. Zero value means API + "/metrics".
	Metrics string
	// PIDs, when set, are the local server's processes (a roomcast dev, or a fleet: ChatLinks
	// and what serves them) whose RSS and CPU time are read from /proc instead of from
	// Metrics, summed and reported per process.
	PIDs PIDList
	// BenchCPUs, when set, pins the bench process and its worker processes to these CPUs.
	// Zero value means the bench runs where it was started (say, under taskset).
	BenchCPUs CPUList
	// ServerCPUs, when set, pins every thread of the PIDs processes to these CPUs. It needs
	// PIDs. Zero value means they run where they were started.
	ServerCPUs CPUList
	// App and Secret mint the clients' tokens. Zero App means "demo"; Secret is required.
	App    string
	Secret []byte
	// Transport is sdk.TransportWebSocket or sdk.TransportTCP. Zero value means WebSocket.
	Transport string
	// TLSCA is a PEM file of the CA certificates the bench trusts, instead of the system's,
	// for https:// (dispatcher, API, metrics), wss:// and TLS TCP: the way to measure a
	// server with a private or self-signed certificate. Zero value means the system's roots.
	TLSCA string
	// TLSNoResume makes every TLS connection of the members a full handshake; zero value (false)
	// means the members share a session cache and resume the sessions the server gives them.
	TLSNoResume bool

	// N is how many clients. Required.
	N int
	// Room is the room the members join. Zero value means "bench-<run id>", a fresh room.
	Room string
	// Rooms spreads the members of conns and login over rooms Room-0 .. Room-(Rooms-1).
	// Zero value means one room.
	Rooms int

	// Rate is messages per second (fanout) or logins per second (login). Required for those.
	Rate float64
	// Duration is how long fanout publishes. Zero value means 10s.
	Duration time.Duration
	// Tick is the room's flush tick (fanout). Zero value means the server's default.
	Tick time.Duration
	// LatencyBudget is the room's latency_budget_ms (fanout): how long its normal and bulk
	// messages may wait to share a frame. Zero value means the server's default.
	LatencyBudget time.Duration
	// NoMerge switches merging off for the room (fanout).
	NoMerge bool
	// Tags, when positive, makes fanout tag-targeted with that many distinct tag sets: the
	// members carry tags by group and class and every message has a tag expression selecting
	// some classes and groups (the scheme is in tags.go and docs/benchmarks.md). Zero value
	// means untargeted: every member gets every message.
	Tags int
	// Lane is "critical", "normal", "bulk" or "mix" (round robin). Zero value means critical.
	Lane string
	// Size is the message body size in bytes, at least 24. Zero value means 64.
	Size int
	// Senders is how many concurrent HTTP senders publish (fanout). Zero value means Rate/5,
	// at least 16 and at most 128: enough that a server API slowed down by the fan-out it
	// serves (tens of milliseconds an answer) still gets the full rate.
	Senders int
	// Client is the kind of client of each fanout, conns and login member: ClientSDK
	// (sdk.Client, as apps use it) or ClientRaw (the protocol spoken directly, with far less CPU
	// per delivery: the bench shares the machine with the server). Zero value means ClientSDK.
	// Other scenarios always use the SDK, but upload, which uses raw members.
	Client string
	// Slow is how many extra members of the room (fanout) log in over a raw connection with
	// a small receive buffer and then never read; they count in no delivery figure. Zero
	// value means none.
	Slow int
	// LiveState has the raw members of fanout ask for the room's live state (viewer counts,
	// member notices, attributes), as the SDKs do, and count the frames. Zero value means
	// they do not (as clients before the live state).
	LiveState bool
	// Churn is how many extra members a second log in to the room (fanout) while it publishes,
	// each leaving ChurnLife later, so that the room's count changes every viewer interval;
	// they count in no delivery figure. Zero value means none.
	Churn float64
	// Batch is how many messages each server API request carries (fanout): more than 1 uses
	// the batch send. Zero value means 1.
	Batch int
	// APIStream, when set, is the server API's gRPC address (host:port), and fanout publishes
	// over one SendStream there (one send per message on a long-lived stream) instead of HTTP
	// requests. Zero value means HTTP.
	APIStream string
	// Uploaders is how many of the members send messages themselves (upload). Required there.
	Uploaders int
	// Every is how often each uploader sends one message (upload); the uploaders are spread
	// evenly over it. Required for upload.
	Every time.Duration
	// Likes is how many likes a second every member taps (upload): CounterAdds of the room's
	// counter "like", spread evenly over the members. Zero value means none.
	Likes float64
	// Wait bounds the wait for stragglers after the last publish (fanout). Zero value means 10s.
	Wait time.Duration
	// Pause is how long the members sit idle after they joined, before the server's CPU is
	// read and the publishing starts (fanout): the aftermath of the logins on the server (their
	// reports, presence events, garbage) is then neither in the figures nor in the way.
	// Zero value means 3s; negative, none.
	Pause time.Duration
	// Settle bounds the wait for the server's RSS to settle (conns). Zero value means 30s.
	Settle time.Duration
	// Hold keeps the members connected this long after the measurement (conns), so the
	// server can be profiled in that state. Zero value means they leave at once.
	Hold time.Duration

	// Conns is how many keep-alive connections the virtual viewers of cdn share. Zero value
	// means 128.
	Conns int
	// Edge is the base URL of a CDN edge in front of the room's origin for cdn's viewers to
	// poll. Zero value means the bench runs nginx (internal/tools/cdnedge) in front of the origin, and
	// counts the requests that reach the origin.
	Edge string
	// EdgeWorkers is how many worker processes the bench's nginx runs. Zero value means 1.
	EdgeWorkers int

	// LoginRate paces fanout's members' logins, per second over all worker processes, instead
	// of Concurrency: a big room joins at the pace a real audience arrives, not as fast as the
	// server takes it. Zero value means Concurrency logins in flight.
	LoginRate float64
	// Concurrency bounds the logins in flight while members join (conns, fanout). Zero value
	// means 128.
	Concurrency int
	// PerProcess is how many clients one process holds. A run with more uses worker
	// processes. Zero value means DefaultPerProcess.
	PerProcess int
	// WorkerCommand starts a worker process (one that runs ServeWorker). Zero value means this
	// binary with arguments "bench worker".
	WorkerCommand []string
	// WorkerStderr receives the worker processes' standard error. Nil means discarded.
	WorkerStderr io.Writer

	// Progress, if set, is called about once a second with a status line during long phases.
	Progress func(line string)
	// Log receives the clients' logs. Nil means none.
	Log *slog.Logger

	caPEM []byte // TLSCA's contents, read by withDefaults
}

// tlsConfig trusts the CA certificates in caPEM; nil (the system's roots) without any.
func tlsConfig(caPEM []byte) *tls.Config {
	if len(caPEM) == 0 {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

const (
	defaultDuration    = 10 * time.Second
	defaultWait        = 10 * time.Second
	defaultPause       = 3 * time.Second
	defaultSettle      = 30 * time.Second
	defaultConcurrency = 128
)

// withDefaults returns c with the zero values replaced by the documented defaults, and an
// error if the filled Config is one no scenario can run (each scenario checks its own fields
// too).
func (c Config) withDefaults() (Config, error) {
	c.Dispatcher = strings.TrimRight(c.Dispatcher, "/")
	if c.API == "" {
		c.API = c.Dispatcher
	}
	c.API = strings.TrimRight(c.API, "/")
	if c.Metrics == "" && c.API != "" {
		c.Metrics = c.API + "/metrics"
	}
	if c.App == "" {
		c.App = "demo"
	}
	if c.Transport == "" {
		c.Transport = sdk.TransportWebSocket
	}
	if c.Rooms <= 0 {
		c.Rooms = 1
	}
	if c.Duration <= 0 {
		c.Duration = defaultDuration
	}
	if c.Lane == "" {
		c.Lane = "critical"
	}
	if c.Size <= 0 {
		c.Size = defaultSize
	}
	if c.Senders <= 0 {
		c.Senders = min(max(int(c.Rate/5), 16), 128)
	}
	if c.Wait <= 0 {
		c.Wait = defaultWait
	}
	if c.Pause == 0 {
		c.Pause = defaultPause
	}
	if c.Settle <= 0 {
		c.Settle = defaultSettle
	}
	if c.Concurrency <= 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.PerProcess <= 0 {
		c.PerProcess = DefaultPerProcess
	}
	if c.TLSCA != "" {
		b, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return c, fmt.Errorf("bench: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return c, fmt.Errorf("bench: no PEM certificate in %s", c.TLSCA)
		}
		c.caPEM = b
	}
	switch {
	case c.Dispatcher == "":
		return c, errors.New("bench: no dispatcher URL")
	case len(c.Secret) == 0:
		return c, errors.New("bench: no app secret")
	case c.N < 1:
		return c, fmt.Errorf("bench: n must be at least 1, got %d", c.N)
	case c.Transport != sdk.TransportWebSocket && c.Transport != sdk.TransportTCP:
		return c, fmt.Errorf("bench: unknown transport %q (want ws or tcp)", c.Transport)
	case c.Client != "" && c.Client != ClientSDK && c.Client != ClientRaw:
		return c, fmt.Errorf("bench: unknown client %q (want sdk or raw)", c.Client)
	case len(c.ServerCPUs) > 0 && len(c.PIDs) == 0:
		return c, errors.New("bench: server CPUs need the server's pids (--pid)")
	}
	return c, nil
}

// runner is one bench run: its id, its workers and its view of the server.
type runner struct {
	cfg     Config
	id      runID
	room    string
	hc      *http.Client // for metrics and room settings
	server  probeServer
	workers []worker
}

// newRunner pins the bench and the server as cfg asks, before any worker process starts.
func newRunner(cfg Config) (*runner, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2, TLSClientConfig: tlsConfig(cfg.caPEM)}}
	r := &runner{cfg: cfg, hc: hc, server: probeServer{metricsURL: cfg.Metrics, pids: cfg.PIDs, hc: hc}}
	_, _ = rand.Read(r.id[:])
	r.room = cfg.Room
	if r.room == "" {
		r.room = fmt.Sprintf("bench-%x", r.id)
	}
	return r, r.pin()
}

func (r *runner) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		r.cfg.Progress(fmt.Sprintf(format, args...))
	}
}

// start starts the workers for the run's clients: in this process when they fit in one,
// else in worker processes.
func (r *runner) start(scenario string, rate float64, messageBuffer int) error {
	parts := split(r.cfg.N, r.cfg.PerProcess)
	base := spec{
		Dispatcher: r.cfg.Dispatcher, App: r.cfg.App, Secret: r.cfg.Secret,
		Transport: r.cfg.Transport, Room: r.room, Rooms: r.cfg.Rooms, Run: r.id, Concurrency: r.cfg.Concurrency,
		MessageBuffer: messageBuffer, Tags: r.cfg.Tags, CAPEM: r.cfg.caPEM, TLSNoResume: r.cfg.TLSNoResume,
		LiveState: r.cfg.LiveState,
	}
	switch scenario {
	case "fanout", "conns", "login":
		base.Client = r.cfg.Client
	case "upload":
		base.Client = ClientRaw
	}
	if len(parts) == 1 {
		sp := base
		sp.Count, sp.LoginRate = r.cfg.N, rate
		r.workers = []worker{&localWorker{f: newFleet(sp, r.cfg.Log)}}
		return nil
	}
	argv := r.cfg.WorkerCommand
	if len(argv) == 0 {
		var err error
		if argv, err = workerCommand(); err != nil {
			return err
		}
	}
	stderr := r.cfg.WorkerStderr
	if stderr == nil {
		stderr = io.Discard
	} else {
		// An *os.File is handed to the processes as is; any other writer is copied to by one
		// goroutine per process.
		stderr = SyncWriter(stderr)
	}
	first := 0
	for _, n := range parts {
		sp := base
		sp.First, sp.Count = first, n
		sp.LoginRate = rate * float64(n) / float64(r.cfg.N)
		sp.Concurrency = max(1, r.cfg.Concurrency/len(parts))
		first += n
		w, err := startProcWorker(argv, sp, stderr)
		if err != nil {
			return err
		}
		r.workers = append(r.workers, w)
	}
	return nil
}

// SyncWriter returns w safe for writes from several goroutines: an *os.File (or a writer
// SyncWriter returned) as is, any other writer behind a lock.
func SyncWriter(w io.Writer) io.Writer {
	switch w.(type) {
	case *os.File, *lockedWriter:
		return w
	}
	return &lockedWriter{w: w}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// stop ends every worker.
func (r *runner) stop() {
	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Go(w.stop)
	}
	wg.Wait()
	r.hc.CloseIdleConnections()
}

// status adds up the workers' progress.
func (r *runner) status() status {
	var total status
	for _, w := range r.workers {
		st := w.status()
		total.Tried += st.Tried
		total.Connected += st.Connected
		total.Failed += st.Failed
		total.Delivered += st.Delivered
	}
	return total
}

// everySecond calls f about once a second until the returned stop is called.
func (r *runner) everySecond(f func()) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// connect runs every worker's logins and waits for them, showing progress.
func (r *runner) connect(ctx context.Context, verb string) error {
	start := time.Now()
	stop := r.everySecond(func() {
		st := r.status()
		el := time.Since(start).Seconds()
		r.progress("%s %s %d/%d ok, %d failed, %.0f/s", bar(st.Tried, int64(r.cfg.N)), verb, st.Connected, r.cfg.N, st.Failed, float64(st.Tried)/el)
	})
	defer stop()
	errs := make([]error, len(r.workers))
	var wg sync.WaitGroup
	for i, w := range r.workers {
		wg.Go(func() { errs[i] = w.connect(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// finish asks every worker to wait for its members to have the accepted messages of their
// audiences and report, and merges the reports.
func (r *runner) finish(ctx context.Context, accepted seqSet, wait time.Duration) (report, error) {
	reps := make([]report, len(r.workers))
	errs := make([]error, len(r.workers))
	var wg sync.WaitGroup
	for i, w := range r.workers {
		wg.Go(func() { reps[i], errs[i] = w.finish(ctx, accepted, wait) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return report{}, err
	}
	total := merge(reps)
	cpu, rss := selfUsage()
	total.CPUSeconds += cpu
	total.MaxRSSBytes += rss
	return total, nil
}

// merge adds up the reports of several workers.
func merge(reps []report) report {
	var t report
	lat, login := newLatencyHistogram(), newLatencyHistogram()
	for _, r := range reps {
		t.Connected += r.Connected
		t.Failed += r.Failed
		t.Disconnected += r.Disconnected
		t.Limited += r.Limited
		for _, e := range r.Errors {
			if len(t.Errors) < maxErrors {
				t.Errors = append(t.Errors, e)
			}
		}
		for l := range t.Lanes {
			t.Lanes[l] += r.Lanes[l]
		}
		t.Dup += r.Dup
		t.Leaked += r.Leaked
		t.Thinned += r.Thinned
		t.LiveFrames += r.LiveFrames
		if len(t.Groups) < len(r.Groups) {
			t.Groups = append(t.Groups, make([]int64, len(r.Groups)-len(t.Groups))...)
		}
		for g, n := range r.Groups {
			t.Groups[g] += n
		}
		t.Incomplete += r.Incomplete
		if r.FirstRecv != 0 && (t.FirstRecv == 0 || r.FirstRecv < t.FirstRecv) {
			t.FirstRecv = r.FirstRecv
		}
		t.LastRecv = max(t.LastRecv, r.LastRecv)
		if r.LoginStart != 0 && (t.LoginStart == 0 || r.LoginStart < t.LoginStart) {
			t.LoginStart = r.LoginStart
		}
		t.LoginEnd = max(t.LoginEnd, r.LoginEnd)
		if r.Latency != nil {
			lat.Merge(hdrhistogram.Import(r.Latency))
		}
		if r.LoginLatency != nil {
			login.Merge(hdrhistogram.Import(r.LoginLatency))
		}
		t.CPUSeconds += r.CPUSeconds
		t.MaxRSSBytes += r.MaxRSSBytes
	}
	t.Latency, t.LoginLatency = lat.Export(), login.Export()
	return t
}

// quantiles returns p50, p99 and max of a histogram of microseconds, in milliseconds.
func quantiles(s *hdrhistogram.Snapshot) (p50, p99, maxMS float64) {
	if s == nil {
		return 0, 0, 0
	}
	h := hdrhistogram.Import(s)
	if h.TotalCount() == 0 {
		return 0, 0, 0
	}
	return float64(h.ValueAtQuantile(50)) / 1000, float64(h.ValueAtQuantile(99)) / 1000, float64(h.Max()) / 1000
}

// bar draws a 20-character progress bar.
func bar(done, total int64) string {
	const width = 20
	n := 0
	if total > 0 {
		n = int(min(done*width/total, width))
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}
