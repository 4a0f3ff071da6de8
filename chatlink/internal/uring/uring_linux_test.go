package uring

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"roomcast/internal/testkit"
)

// socketPair returns the server side's descriptor of a loopback TCP connection (non-blocking,
// as Go leaves it) and the client's net.Conn.
func socketPair(t *testing.T) (int32, net.Conn) {
	t.Helper()
	s, c := testkit.TCPPair(t)
	var fd int32
	rc, _ := s.SyscallConn()
	_ = rc.Control(func(d uintptr) { fd = int32(d) })
	return fd, c
}

// fullSocket returns the server side's descriptor of a loopback TCP connection whose send
// buffer is full: its peer reads nothing.
func fullSocket(t *testing.T) int32 {
	t.Helper()
	fd, _ := socketPair(t)
	_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := unix.Write(int(fd), chunk); err == unix.EAGAIN {
			return fd
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket never filled")
		}
	}
}

// TestRingSend sends one batch to three sockets: one that reads, one whose buffers are full
// and one descriptor that is no socket. The ring must neither wait for the full one nor stop
// at the bad one: each gets its own result, and the reading peer gets its bytes.
func TestRingSend(t *testing.T) {
	r, err := NewRing(Entries)
	if err != nil {
		t.Fatalf("io_uring unavailable here (the node would write plainly): %v", err)
	}
	defer r.Close()
	okFD, okPeer := socketPair(t)
	fullFD := fullSocket(t)
	notSocket, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(notSocket)

	frame := []byte("one frame")
	res := make([]int32, 3)
	done := make(chan error, 1)
	go func() { done <- r.Send([]int32{fullFD, int32(notSocket), okFD}, [][]byte{frame, frame, frame}, res) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("send waited for a full socket")
	}
	if syscall.Errno(-res[0]) != syscall.EAGAIN {
		t.Errorf("full socket: result %d, want -EAGAIN", res[0])
	}
	if syscall.Errno(-res[1]) != syscall.ENOTSOCK {
		t.Errorf("eventfd: result %d, want -ENOTSOCK", res[1])
	}
	if res[2] != int32(len(frame)) {
		t.Fatalf("reading socket: result %d, want %d", res[2], len(frame))
	}
	got := make([]byte, len(frame))
	_ = okPeer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(okPeer, got); err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("peer read %q, %v", got, err)
	}

	// The ring is reusable: a second batch lands after the first.
	if err := r.Send([]int32{okFD}, [][]byte{[]byte("two")}, res[:1]); err != nil || res[0] != 3 {
		t.Fatalf("second send: %d, %v", res[0], err)
	}
	got = got[:3]
	if _, err := io.ReadFull(okPeer, got); err != nil || string(got) != "two" {
		t.Fatalf("peer read %q, %v", got, err)
	}
}

// TestRingsBounded: with every ring in use, a writer waits for one to be put back, and gets
// that one; no ring is made beyond the bound.
func TestRingsBounded(t *testing.T) {
	rs, err := NewRings(1)
	if err != nil {
		t.Fatalf("io_uring unavailable here (the node would write plainly): %v", err)
	}
	defer rs.Close()
	r1, err := rs.Get()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Ring)
	go func() {
		r, err := rs.Get()
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	select {
	case <-got:
		t.Fatal("a second ring was handed out past the bound")
	case <-time.After(50 * time.Millisecond):
	}
	rs.Put(r1)
	if r2 := <-got; r2 != r1 {
		t.Fatal("the waiting writer got a new ring, not the one put back")
	} else {
		rs.Put(r2)
	}
}

// TestWritePlain: the plain writes give their results as a ring does, without waiting for a
// full socket.
func TestWritePlain(t *testing.T) {
	okFD, okPeer := socketPair(t)
	fullFD := fullSocket(t)
	frame := []byte("one frame")
	res := make([]int32, 2)
	WritePlain([]int32{fullFD, okFD}, [][]byte{frame, frame}, res)
	if syscall.Errno(-res[0]) != syscall.EAGAIN || res[1] != int32(len(frame)) {
		t.Fatalf("results %v, want [-EAGAIN %d]", res, len(frame))
	}
	got := make([]byte, len(frame))
	_ = okPeer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(okPeer, got); err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("peer read %q, %v", got, err)
	}
}
