// Package testutil holds helpers for tests across the module: small, dependency-free plumbing,
// never a test's logic.
package testutil

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// CheckFor calls f every `every` until it returns nil, and fails t with f's last error if it has
// not by `total`: poll, don't sleep.
func CheckFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(every)
	}
}

// ProcessCPU returns the CPU time (user and system) the process has used, for benchmarks that
// report CPU per operation rather than wall time.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// FreeAddr returns a loopback address with a port free right now, for a listener a test names
// before it opens.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TCPPair returns both ends of a loopback TCP connection, closed when the test ends: the side
// a server accepted, and the client's.
func TCPPair(t testing.TB) (server *net.TCPConn, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); s.Close() })
	return s.(*net.TCPConn), client
}

// Clock is a clock that moves only when the test moves it; its Now fits a Config.Now.
type Clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

// NewClock returns a clock set at start.
func NewClock(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
