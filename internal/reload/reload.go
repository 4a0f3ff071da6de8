// Package reload takes up changed configuration without a restart: a Watcher calls its Load
// function when the contents of one of its files change (looked at every Config.Every) and when
// the process gets SIGHUP. A Load that fails must apply nothing, so that what is in force stays;
// the failure is logged (once until the files change again) and counted in
// roomcast_config_reloads_total{result="error"}. The watcher reads files and signals only: what
// a reload reads and changes is Load's. It is the mechanism of the ChatLinks' --ip-list file
// (chatlink/limits.go) made reusable: a look every second, SIGHUP to force one.
package reload

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultEvery is how often a Watcher looks at its files.
const DefaultEvery = time.Second

// Config configures a Watcher.
type Config struct {
	// Load reads the configuration and applies it; on error it applies nothing. Required.
	Load func() error
	// Files returns the files whose change calls Load, asked again after each Load (the new
	// configuration may name other files). Zero value means none: SIGHUP and Reload only.
	Files func() []string
	// Every is how often the files are looked at. Zero value means DefaultEvery.
	Every time.Duration
	// NoSignal leaves SIGHUP alone (tests that call Reload). Zero value means SIGHUP reloads.
	NoSignal bool
	// Log receives a line for each reload and each failed one. Zero value means none.
	Log *slog.Logger
	// Registerer receives roomcast_config_reloads_total. Zero value means none.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Load == nil {
		return c, errors.New("reload: Config.Load is required")
	}
	if c.Files == nil {
		c.Files = func() []string { return nil }
	}
	if c.Every <= 0 {
		c.Every = DefaultEvery
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Watcher reloads a configuration when its files change or on SIGHUP.
type Watcher struct {
	cfg     Config
	results *prometheus.CounterVec
	stop    chan struct{}
	done    chan struct{}

	mu       sync.Mutex // guards the fields below; held through a reload
	files    []string
	sums     [][]byte // the files' contents' digests at the last look, nil for a missing file
	failedAs string   // the last failed reload's error, so that it is logged once
	stopOnce sync.Once
}

// Start watches cfg's files (their contents now are the ones in force) and, unless
// cfg.NoSignal, SIGHUP; Stop ends it.
func Start(cfg Config) (*Watcher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Watcher{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	w.results = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_config_reloads_total",
		Help: "Reloads of the configuration that changes without a restart (API keys, token secrets, callbacks, log level) after a file changed or on SIGHUP, by result: ok, or error (what is in force stays).",
	}, []string{"result"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(w.results); err != nil {
			return nil, err
		}
	}
	w.results.WithLabelValues("ok")
	w.results.WithLabelValues("error")
	w.files = cfg.Files()
	w.sums = digests(w.files)
	var hup chan os.Signal
	if !cfg.NoSignal {
		hup = make(chan os.Signal, 1)
		// Wired before Start returns, so that a SIGHUP right after it is not lost.
		signal.Notify(hup, syscall.SIGHUP)
	}
	go w.loop(hup)
	return w, nil
}

// Stop stops watching and waits for a reload under way. It may be called more than once.
func (w *Watcher) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// Reload loads the configuration now, whether its files changed or not, as SIGHUP does.
func (w *Watcher) Reload() error { return w.reload(true) }

func (w *Watcher) loop(hup chan os.Signal) {
	defer close(w.done)
	if hup != nil {
		defer signal.Stop(hup)
	}
	t := time.NewTicker(w.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-hup:
			_ = w.reload(true)
		case <-t.C:
			_ = w.reload(false)
		}
	}
}

// reload calls Load when forced or when a file's contents changed since the last look.
func (w *Watcher) reload(force bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	sums := digests(w.files)
	changed := !slices.EqualFunc(sums, w.sums, bytes.Equal)
	if !force && !changed {
		return nil
	}
	w.sums = sums
	err := w.cfg.Load()
	if err != nil {
		w.results.WithLabelValues("error").Inc()
		// A file being written may fail to load at one look and load at the next: logged once
		// until it changes, and always on SIGHUP.
		if msg := err.Error(); force || msg != w.failedAs {
			w.failedAs = msg
			w.cfg.Log.Warn("configuration not reloaded; keeping the one in force", "err", err, "sighup", force)
		}
		return err
	}
	w.failedAs = ""
	w.results.WithLabelValues("ok").Inc()
	w.files = w.cfg.Files()
	w.sums = digests(w.files)
	w.cfg.Log.Info("configuration reloaded", "files", w.files, "sighup", force)
	return nil
}

// digests returns each file's contents' SHA-256, nil for one that cannot be read.
func digests(files []string) [][]byte {
	out := make([][]byte, len(files))
	for i, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			sum := sha256.Sum256(b)
			out[i] = sum[:]
		}
	}
	return out
}
