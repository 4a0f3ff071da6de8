package uring

import (
	"fmt"
	"io"
	"runtime"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// BenchmarkLoopbackWrite measures the floor under a ChatLink's per-write cost on this machine:
// one write(2) of a frame to one of many loopback TCP sockets, round robin, with the peers
// reading in other goroutines. cpu-ns/write is the writing thread's own CPU time
// (RUSAGE_THREAD), which on loopback includes the kernel's receive processing of the segment,
// done in the sender's context. A fan-out that writes one frame per member per tick cannot
// cost less per frame than this.
func BenchmarkLoopbackWrite(b *testing.B) {
	for _, size := range []int{130, 700} { // one 64-byte message; five merged
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			fds := loopbackSockets(b, 1000)
			frame := make([]byte, size)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadCPU()
			b.ResetTimer()
			for i := range b.N {
				for {
					_, err := syscall.Write(fds[i%len(fds)], frame)
					if err == syscall.EAGAIN { // the duplicate shares the socket's O_NONBLOCK
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil {
						b.Fatal(err)
					}
					break
				}
				if i%len(fds) == len(fds)-1 {
					time.Sleep(time.Millisecond) // let the readers drain, as between ticks
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((threadCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/write")
		})
	}
}

// BenchmarkRingSend is BenchmarkLoopbackWrite with the frames sent through an io_uring ring,
// Entries sockets per system call, as the ChatLink sends a phase group (chatlink/batch.go).
// The sends run inline in the submitting thread, so its CPU time (RUSAGE_THREAD) holds their
// cost.
func BenchmarkRingSend(b *testing.B) {
	r, err := NewRing(Entries)
	if err != nil {
		b.Fatalf("io_uring unavailable here: %v", err)
	}
	defer r.Close()
	for _, size := range []int{130, 700} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			socks := loopbackSockets(b, 1024)
			fds := make([]int32, len(socks))
			for i, fd := range socks {
				fds[i] = int32(fd)
			}
			frame := make([]byte, size)
			bufs := make([][]byte, Entries)
			for i := range bufs {
				bufs[i] = frame
			}
			res := make([]int32, Entries)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadCPU()
			b.ResetTimer()
			sent := 0
			for sent < b.N {
				for at := 0; at < len(fds) && sent < b.N; at += Entries {
					k := min(Entries, b.N-sent)
					if err := r.Send(fds[at:at+k], bufs[:k], res[:k]); err != nil {
						b.Fatal(err)
					}
					for _, n := range res[:k] {
						if n != int32(size) {
							b.Fatalf("a send took %d of %d bytes", n, size)
						}
					}
					sent += k
				}
				time.Sleep(time.Millisecond) // let the readers drain, as between ticks
			}
			b.StopTimer()
			b.ReportMetric(float64((threadCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/write")
		})
	}
}

// loopbackSockets returns the server side's descriptors (duplicates, for plain system calls)
// of n loopback TCP connections whose peers read everything in goroutines of their own.
func loopbackSockets(b *testing.B, n int) []int {
	var fds []int
	for range n {
		s, c := testkit.TCPPair(b)
		go func() { _, _ = io.Copy(io.Discard, c) }()
		f, err := s.File()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		fds = append(fds, int(f.Fd()))
	}
	return fds
}

func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
