package osdep

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestCPUCounts spins until the process's CPU time has grown by 50ms and checks that the wall
// time allows it: a reading that stood still would never get there (10 s), one that jumped
// would get there sooner than the wall clock's time on every core. The spin is measured in CPU
// time, not wall time: on a busy machine the spinning thread waits its turn.
func TestCPUCounts(t *testing.T) {
	before, ok := CPU()
	if !ok {
		t.Skipf("no CPU accounting on %s", runtime.GOOS)
	}
	const want = 50 * time.Millisecond
	start := time.Now()
	var got time.Duration
	for got < want {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("CPU grew by %v over a 10s spin", got)
		}
		for s := time.Now(); time.Since(s) < 5*time.Millisecond; {
		}
		after, _ := CPU()
		got = after - before
	}
	// CPU time is counted in clock ticks (10 ms): allow two besides.
	if wall := time.Since(start); got > wall*time.Duration(runtime.NumCPU())+20*time.Millisecond {
		t.Fatalf("CPU grew by %v in %v of wall time on %d CPUs", got, wall, runtime.NumCPU())
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
