package chatlink

import (
	"encoding/binary"
	"io"
	"net"
	"slices"
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

// FuzzTCPFrames feeds a byte stream to a polled connection's length-prefixed TCP reader in
// pieces, as reads deliver it: it must hand over exactly the frames the stream holds, up to
// the first length it refuses (zero, or over the limit), and stop there, while what it keeps
// of an incomplete frame grows with what has arrived, not with the length it announces.
func FuzzTCPFrames(f *testing.F) {
	prefixed := func(frames ...string) []byte {
		var b []byte
		for _, fr := range frames {
			b = binary.BigEndian.AppendUint32(b, uint32(len(fr)))
			b = append(b, fr...)
		}
		return b
	}
	f.Add(prefixed("login", "", "after an empty one"), uint8(3))
	f.Add(prefixed("a", "bb", "ccc"), uint8(1))
	f.Add(append(prefixed("ok"), 0x40, 0, 0, 0), uint8(7))              // announces 1 GiB
	f.Add(append(prefixed("ok"), 0, 0, 0x03, 0xe8, 'x', 'y'), uint8(2)) // 1000 bytes announced, 2 sent
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		const max = 1024
		// What a reader of the whole stream finds.
		var want []string
		wantStop := false
		for rest := stream; len(rest) >= 4; {
			size := binary.BigEndian.Uint32(rest)
			if size == 0 || size > max {
				wantStop = true
				break
			}
			if len(rest) < 4+int(size) {
				break
			}
			want = append(want, string(rest[4:4+size]))
			rest = rest[4+size:]
		}

		var got []string
		p := &polled{}
		p.feed = func(data []byte) (int, int, readNext) {
			return tcpFrames(data, func(size uint32) bool { return size == 0 || size > max },
				func(b []byte) { got = append(got, string(b)) })
		}
		stopped := false
		for len(stream) > 0 && !stopped {
			// As read does: into the room left after what is pending.
			buf := p.pending
			if buf == nil {
				buf = make([]byte, 0, 4096)
			} else if len(buf) == cap(buf) {
				buf = slices.Grow(buf, pendingMin)
			}
			n := copy(buf[len(buf):cap(buf)], stream[:min(int(chunk)+1, len(stream))])
			stream = stream[n:]
			switch next := p.consume(buf[:len(buf)+n]); next {
			case readStopped:
				stopped = true
			case readOn:
			default:
				t.Fatalf("consume returned %v", next)
			}
			if len(p.pending) > 0 && cap(p.pending) > 3*len(p.pending)+2*pendingMin {
				t.Fatalf("%d bytes pending held in a buffer of %d", len(p.pending), cap(p.pending))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("frames %q, want %q", got, want)
		}
		if stopped != wantStop {
			t.Fatalf("stopped %v, want %v", stopped, wantStop)
		}
	})
}
