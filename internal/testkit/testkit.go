// Package testkit is what the module's tests share: polling instead of sleeping, a clock that
// moves when the test says, free ports and loopback TCP pairs, an embedded NATS server, process
// CPU time, table tests of
// a Config's withDefaults, and a wire client that speaks the client protocol (docs/protocol.md)
// by hand over WebSocket and TCP. Its sub-packages: testcluster starts an in-process cluster per
// test, regions NATS clusters joined by gateways through latency-adding proxies, procs the
// deployment as real processes, s3test versitygw as the S3 server, testcerts a
// throwaway CA. Only tests import it, components' in-package tests included, so it imports no
// component. It holds plumbing, never a test's logic.
package testkit

import (
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
