package netpoll

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// TestLevelDetached: a detached socket registered Level is read in place by its function, on
// every wait while it holds data, with no Arm, also when Run naps between waits; the peer's
// end is seen, and a closed FD refuses further calls.
func TestLevelDetached(t *testing.T) {
	p := startPoller(t, Config{Nap: time.Millisecond, NapBelow: 4})
	s, peer := testkit.TCPPair(t)
	fd, err := Detach(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fd.Close() })
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("the detached net.Conn still writes")
	}

	got := make(chan string, 16)
	eof := make(chan struct{})
	id := p.NewID()
	buf := make([]byte, 2) // smaller than what comes: the rest is read on the next waits
	if err := p.Add(fd, id, func() {
		n, end, err := ReadNow(fd, buf)
		switch {
		case err != nil:
			t.Errorf("ReadNow: %v", err)
		case end:
			p.Remove(id)
			close(eof)
		case n > 0:
			got <- string(buf[:n])
		}
	}, Level); err != nil {
		t.Fatal(err)
	}
	read := func(want string) {
		t.Helper()
		var s string
		for len(s) < len(want) {
			select {
			case b := <-got:
				s += b
			case <-time.After(5 * time.Second):
				t.Fatalf("read %q, want %q", s, want)
			}
		}
		if s != want {
			t.Fatalf("read %q, want %q", s, want)
		}
	}
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	read("hello")
	if _, err := peer.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	read("again")

	if n, err := WritevNow(fd, []byte("he"), []byte("llo")); n != 5 || err != nil {
		t.Fatalf("WritevNow = %d, %v", n, err)
	}
	back := make([]byte, 5)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(back); err != nil || string(back) != "hello" {
		t.Fatalf("the peer read %q, %v", back, err)
	}

	_ = peer.Close()
	select {
	case <-eof:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's end was not seen")
	}
	if err := fd.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadNow(fd, buf); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadNow after Close: %v", err)
	}
	if err := fd.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// BenchmarkPollerRead: a sender writes 64-byte frames round-robin to 64 sockets that a poller
// reads; an op is one frame written, seen and read. oneshot-handoff reads as the ChatLink does
// (a goroutine per event, then Arm), level-inline as the load generator does (in place, on a
// detached socket).
func BenchmarkPollerRead(b *testing.B) {
	const conns, frame = 64, 64
	for _, c := range []struct {
		name   string
		mode   Mode
		detach bool
	}{{"oneshot-handoff", OneShot, false}, {"level-inline", Level, true}} {
		b.Run(c.name, func(b *testing.B) {
			p := startPoller(b, Config{})
			var read atomic.Int64
			peers := make([]net.Conn, conns)
			for i := range peers {
				s, peer := testkit.TCPPair(b)
				peers[i] = peer
				var rc syscall.RawConn
				if c.detach {
					fd, err := Detach(s)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = fd.Close() })
					rc = fd
				} else {
					r, err := s.SyscallConn()
					if err != nil {
						b.Fatal(err)
					}
					rc = r
				}
				id := p.NewID()
				buf := make([]byte, 4096)
				readNow := func() {
					if n, _, err := ReadNow(rc, buf); err == nil {
						read.Add(int64(n))
					}
				}
				f := readNow
				if c.mode == OneShot {
					f = func() {
						go func() {
							readNow()
							_ = p.Arm(rc, id)
						}()
					}
				}
				if err := p.Add(rc, id, f, c.mode); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { p.Remove(id) })
			}
			msg := make([]byte, frame)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := testkit.ProcessCPU()
			for i := range b.N {
				if _, err := peers[i%conns].Write(msg); err != nil {
					b.Fatal(err)
				}
			}
			for deadline := time.Now().Add(30 * time.Second); read.Load() < int64(b.N*frame); {
				if time.Now().After(deadline) {
					b.Fatalf("read %d of %d bytes", read.Load(), b.N*frame)
				}
				time.Sleep(100 * time.Microsecond)
			}
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
