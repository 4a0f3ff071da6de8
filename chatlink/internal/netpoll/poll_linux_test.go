package netpoll

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// TestPollerOneShot: a registered socket's function runs once when data arrives and not again
// until the socket is armed; ReadNow reads without waiting, and tells an empty socket from one
// whose peer has gone.
func TestPollerOneShot(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	go p.Run()
	defer p.Stop()
	s, peer := testkit.TCPPair(t)
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	readable := make(chan struct{}, 4)
	id := p.NewID()
	if err := p.Add(rc, id, func() { readable <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	defer p.Remove(id)
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

// TestRunParksInGosPoller: an idle Run waits in Go's poller, as a goroutine blocked on a
// socket does, not in a blocking epoll_wait that holds a thread (and wakes one, and the
// runtime's monitor, at every event); and it still ends at Stop.
func TestRunParksInGosPoller(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	go func() { p.Run(); close(ran) }()
	var state string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if state = runState(); strings.Contains(state, "IO wait") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Stop()
	<-ran
	if !strings.Contains(state, "IO wait") {
		t.Fatalf("idle Run waits as %q, want IO wait (Go's poller)", state)
	}
}

// runState returns the state line of the goroutine running Poller.Run ("goroutine 7 [IO
// wait]:"), or "" when there is none.
func runState() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "netpoll.(*Poller).Run(") {
			return strings.SplitN(g, "\n", 2)[0]
		}
	}
	return ""
}
