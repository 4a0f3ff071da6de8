package netpoll

import (
	"net"
	"runtime/metrics"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// startPoller starts a poller, stopped when the test ends.
func startPoller(t testing.TB, cfg Config) *Poller {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go p.Run()
	t.Cleanup(p.Stop)
	return p
}

// pollPair starts a poller and registers the server side of a loopback TCP connection with it
// under id, one-shot; each event sends on readable.
func pollPair(t *testing.T) (p *Poller, rc syscall.RawConn, id uint64, peer net.Conn, readable chan struct{}) {
	t.Helper()
	p = startPoller(t, Config{})
	s, peer := testkit.TCPPair(t)
	var err error
	if rc, err = s.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	readable = make(chan struct{}, 4)
	id = p.NewID()
	if err := p.Add(rc, id, func() { readable <- struct{}{} }, OneShot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Remove(id) })
	return p, rc, id, peer, readable
}

// TestPollerOneShot: a registered socket's function runs once when data arrives and not again
// until the socket is armed; ReadNow reads without waiting, and tells an empty socket from one
// whose peer has gone.
func TestPollerOneShot(t *testing.T) {
	p, rc, id, peer, readable := pollPair(t)
	buf := make([]byte, 16)
	if n, eof, err := ReadNow(rc, buf); n != 0 || eof || err != nil {
		t.Fatalf("empty socket: ReadNow = %d, %v, %v", n, eof, err)
	}

	if _, err := peer.Write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-readable:
	case <-time.After(5 * time.Second):
		t.Fatal("no event for a readable socket")
	}
	if _, err := peer.Write([]byte("two")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-readable:
		t.Fatal("a second event before the socket was armed again")
	case <-time.After(50 * time.Millisecond):
	}
	if n, eof, err := ReadNow(rc, buf); string(buf[:n]) != "onetwo" || eof || err != nil {
		t.Fatalf("ReadNow = %q, %v, %v", buf[:n], eof, err)
	}

	_ = peer.Close()
	if err := p.Arm(rc, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-readable:
	case <-time.After(5 * time.Second):
		t.Fatal("no event after Arm when the peer closed")
	}
	if n, eof, err := ReadNow(rc, buf); n != 0 || !eof || err != nil {
		t.Fatalf("after the peer closed: ReadNow = %d, %v, %v", n, eof, err)
	}
}

// TestWritevNowFullSocket: a socket whose buffers are full takes nothing and returns at once.
func TestWritevNowFullSocket(t *testing.T) {
	s, _ := testkit.TCPPair(t)
	if err := s.SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	hdr, chunk := []byte{1, 2}, make([]byte, 64<<10)
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := WritevNow(rc, hdr, chunk)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket never filled")
		}
	}
}

// TestPollerWaitsInTheRuntime: while Run waits for events, its goroutine is parked in the
// runtime's poller, not in a system call. A goroutine in epoll_wait holds its P there, which
// the runtime's monitor takes back (and hands to another thread) every time it waits.
func TestPollerWaitsInTheRuntime(t *testing.T) {
	inSyscall := func() uint64 {
		s := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := inSyscall()
	_, _, _, peer, readable := pollPair(t)
	time.Sleep(100 * time.Millisecond) // Run is waiting by now
	if got := inSyscall(); got > before {
		t.Fatalf("%d goroutines in a system call while the poller waits, %d before it started", got, before)
	}
	if _, err := peer.Write([]byte("x")); err != nil { // and it still hears events
		t.Fatal(err)
	}
	select {
	case <-readable:
	case <-time.After(5 * time.Second):
		t.Fatal("no event for a readable socket")
	}
}
