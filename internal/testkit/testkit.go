// Package testkit is what the module's tests share: polling instead of sleeping, free ports,
// process CPU time, and a wire client that speaks the client protocol (docs/protocol.md) by hand
// over WebSocket and TCP; its sub-package testcluster starts an in-process cluster per test.
// Only tests import it, components' in-package tests included, so it imports no component. It
// holds plumbing, never a test's logic.
package testkit

import (
	"net"
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
