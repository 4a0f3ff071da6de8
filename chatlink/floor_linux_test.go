package chatlink

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
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
			const sockets = 1000
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			var fds []int
			var keep []net.Conn
			for range sockets {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				s, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				go func() { _, _ = io.Copy(io.Discard, c) }()
				keep = append(keep, c, s)
				f, err := s.(*net.TCPConn).File() // a duplicate, for plain write(2) calls
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				fds = append(fds, int(f.Fd()))
			}
			defer func() {
				for _, c := range keep {
					_ = c.Close()
				}
			}()
			frame := make([]byte, size)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadCPU()
			b.ResetTimer()
			for i := range b.N {
				for {
					_, err := syscall.Write(fds[i%sockets], frame)
					if err == syscall.EAGAIN { // the duplicate shares the socket's O_NONBLOCK
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil {
						b.Fatal(err)
					}
					break
				}
				if i%sockets == sockets-1 {
					time.Sleep(time.Millisecond) // let the readers drain, as between ticks
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((threadCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/write")
		})
	}
}

func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
