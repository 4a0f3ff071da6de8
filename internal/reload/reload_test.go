package reload

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"roomcast/internal/testkit"
)

// fileConfig is a configuration read from one file: its contents, or the error of a file that
// says "bad".
type fileConfig struct {
	path string
	mu   sync.Mutex
	cur  string // what is in force
}

func (c *fileConfig) load() error {
	b, err := os.ReadFile(c.path)
	if err != nil {
		return err
	}
	if strings.Contains(string(b), "bad") {
		return errors.New("bad file")
	}
	c.mu.Lock()
	c.cur = string(b)
	c.mu.Unlock()
	return nil
}

func (c *fileConfig) inForce() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// write replaces the file at once (a new file renamed over it), so that the watcher never
// reads it half written.
func write(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFileChange: a changed file is loaded within a look or two; a bad one keeps what is in
// force and is counted; the next good one is loaded.
func TestFileChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conf")
	write(t, path, "one")
	c := &fileConfig{path: path}
	if err := c.load(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := Start(Config{Load: c.load, Files: func() []string { return []string{path} }, Every: 10 * time.Millisecond, NoSignal: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	count := func(result string) float64 {
		return testutil.ToFloat64(w.results.WithLabelValues(result))
	}
	write(t, path, "two")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := c.inForce(); got != "two" {
			return errors.New("in force: " + got)
		}
		return nil
	})
	write(t, path, "bad")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if count("error") != 1 {
			return errors.New("the bad file not counted yet")
		}
		return nil
	})
	if got := c.inForce(); got != "two" {
		t.Fatalf("after a bad file, in force %q, want the last good one", got)
	}
	write(t, path, "three")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := c.inForce(); got != "three" {
			return errors.New("in force: " + got)
		}
		return nil
	})
	if count("ok") != 2 || count("error") != 1 {
		t.Errorf("reloads ok %v error %v, want 2 and 1", count("ok"), count("error"))
	}
}

// TestSIGHUP: SIGHUP loads the configuration although no file changed (its contents are
// read only by Load, as with a secret whose file the watcher does not know).
func TestSIGHUP(t *testing.T) {
	loads := make(chan struct{}, 1)
	w, err := Start(Config{Load: func() error { loads <- struct{}{}; return nil }, Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-loads:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not reload")
	}
}
