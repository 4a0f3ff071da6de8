package sdk_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"roomcast/sdk"
)

// fakeServerEnv makes the test binary a fake ChatLink (serveFakeProcess) instead of running
// tests: BenchmarkIdleClients keeps the server out of the process it measures.
const fakeServerEnv = "ROOMCAST_SDK_FAKE_SERVER"

// serveFakeProcess runs a fake ChatLink that logs clients in and answers their heartbeats,
// prints its endpoint as JSON, and stops when its standard input closes.
func serveFakeProcess() int {
	f, err := newFakeLink(serveBasic("cl-1", time.Hour))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.stop()
	if err := json.NewEncoder(os.Stdout).Encode(f.endpoint("cl-1")); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startFakeProcess runs the fake ChatLink in a child process and returns its endpoint.
func startFakeProcess(b *testing.B) sdk.Endpoint {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fakeServerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	var ep sdk.Endpoint
	if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&ep); err != nil {
		b.Fatal(err)
	}
	return ep
}

// memory is what the Go runtime holds: heap and goroutine stacks in use, and goroutines. (The
// process's RSS is not reported: after the first run it reuses what earlier runs freed.)
type memory struct{ heap, stack, goroutines float64 }

func readMemory() memory {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memory{heap: float64(ms.HeapInuse), stack: float64(ms.StackInuse), goroutines: float64(runtime.NumGoroutine())}
}

// BenchmarkIdleClients measures the memory of b.N idle, logged-in Clients (the fake ChatLink
// runs in another process), per client: Go heap and stacks in use, and goroutines. Run it
// with a fixed count, e.g. -benchtime 2000x.
func BenchmarkIdleClients(b *testing.B) {
	for _, transport := range transports {
		b.Run(transport, func(b *testing.B) {
			ep := startFakeProcess(b)
			before := readMemory()
			clients := make([]*sdk.Client, b.N)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for i := range b.N {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					c, err := sdk.Dial(ctx, sdk.Config{Token: "x.e30.x", Endpoints: []sdk.Endpoint{ep}, Transport: transport})
					if err != nil {
						b.Error(err)
						return
					}
					clients[i] = c
				})
			}
			wg.Wait()
			after := readMemory()
			n := float64(b.N)
			b.ReportMetric((after.heap+after.stack-before.heap-before.stack)/n, "B/client")
			b.ReportMetric((after.heap-before.heap)/n, "heap-B/client")
			b.ReportMetric((after.stack-before.stack)/n, "stack-B/client")
			b.ReportMetric((after.goroutines-before.goroutines)/n, "goroutines/client")
			for _, c := range clients {
				if c != nil {
					c.Close()
				}
			}
		})
	}
}
