package osdep

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestCPUCounts spins for a while and checks that the process's CPU time grew by about that
// much: a reading that stood still or jumped by seconds would fail.
func TestCPUCounts(t *testing.T) {
	before, ok := CPU()
	if !ok {
		t.Skipf("no CPU accounting on %s", runtime.GOOS)
	}
	spin := 50 * time.Millisecond
	for start := time.Now(); time.Since(start) < spin; {
	}
	after, _ := CPU()
	if got := after - before; got < spin/2 || got > 10*time.Second {
		t.Fatalf("CPU grew by %v over a %v spin", got, spin)
	}
}

func TestMaxRSSAndFileLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("checked on Linux")
	}
	rss, ok := MaxRSS()
	if !ok || rss < 1<<20 || rss > 1<<40 {
		t.Fatalf("MaxRSS = %d, %v: want a process's size in bytes", rss, ok)
	}
	if n, ok := FileLimit(); ok && n < 1 {
		t.Fatalf("FileLimit = %d, true", n)
	}
}

// TestLockFileExcludes takes a file's lock through one open file and checks that a second open
// of it is refused with ErrLocked until the first is closed.
func TestLockFileExcludes(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" && runtime.GOOS != "windows" {
		t.Skipf("not checked on %s", runtime.GOOS)
	}
	name := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	first := open()
	if err := LockFile(first); err != nil {
		t.Fatalf("first lock: %v", err)
	}
	second := open()
	defer second.Close()
	if err := LockFile(second); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock while the first is held: %v, want ErrLocked", err)
	}
	_ = first.Close()
	if err := LockFile(second); err != nil {
		t.Fatalf("second lock after the first closed: %v", err)
	}
}
