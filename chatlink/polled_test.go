package chatlink

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestPolledPendingGrowsWithData: a frame announced large and sent a little at a time is held
// in a buffer about twice what has arrived, not what was announced.
func TestPolledPendingGrowsWithData(t *testing.T) {
	t.Parallel()
	p := &polled{}
	var frames int
	p.feed = func(data []byte) (int, int, readNext) {
		if len(data) < 60000 {
			return 0, 60000, readOn
		}
		frames++
		return 60000, 0, readOn
	}
	chunk := make([]byte, 100)
	if p.consume(chunk) != readOn || cap(p.pending) > 200 {
		t.Fatalf("after 100 bytes of a 60000-byte frame: pending cap %d", cap(p.pending))
	}
	for total := 100; total < 60000; total += 100 {
		if len(p.pending) == cap(p.pending) {
			t.Fatalf("pending full at %d bytes", total)
		}
		data := append(p.pending, chunk...)
		if p.consume(data) != readOn {
			t.Fatal("consume stopped")
		}
		if frames == 0 && cap(p.pending) > 2*len(p.pending)+pendingMin {
			t.Fatalf("pending cap %d for %d bytes", cap(p.pending), len(p.pending))
		}
	}
	if frames != 1 || p.pending != nil {
		t.Fatalf("frames %d, pending %d bytes", frames, len(p.pending))
	}
}

// TestLockFDAfterClose: once the socket is closed, a batch may not have its descriptor (the
// number may belong to a new connection by then).
func TestLockFDAfterClose(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	p := &polled{TCPConn: s.(*net.TCPConn)}
	p.rc, _ = p.SyscallConn()
	_ = p.rc.Control(func(d uintptr) { p.fd = int32(d) })
	fd, ok := p.lockFD()
	if !ok || fd != p.fd {
		t.Fatalf("lockFD on an open socket: %d, %v", fd, ok)
	}
	closed := make(chan struct{})
	go func() { _ = p.closeSocket(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("the socket closed under a batch holding its descriptor")
	case <-time.After(50 * time.Millisecond):
	}
	if _, ok := p.lockFD(); ok {
		t.Fatal("lockFD succeeded while a close was waiting")
	}
	p.unlockFD()
	<-closed
	if _, ok := p.lockFD(); ok {
		t.Fatal("lockFD succeeded on a closed socket")
	}
}
