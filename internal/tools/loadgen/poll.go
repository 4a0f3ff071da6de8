package loadgen

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"roomcast/internal/netpoll"
)

// rawPollers read the raw members' sockets (--client raw) with the shared poller
// (internal/netpoll) instead of a reader goroutine per member. A reader goroutine reads through
// Go's poller, which parks and wakes it for every frame; in the big fan-out runs that took more
// of the shared cores than the server did. Here a member's socket, once logged in, leaves Go's
// runtime (netpoll.Detach), one poller per core watches its share of the sockets,
// level-triggered, and its goroutine reads each readable socket once, parsing the frames in
// place; an incomplete frame's bytes wait in its member. When a wait brings back only a few
// sockets the poller naps rawPollNap before the next, so that one wait serves many frames: the
// latencies the bench reports may be up to that much later than a client would have seen them,
// never earlier. Elsewhere than on Linux there are no pollers, and every raw member has a
// reader goroutine.
type rawPollers struct {
	ps       []*rawPoller
	next     atomic.Uint32
	stopOnce sync.Once
}

type rawPoller struct {
	p *netpoll.Poller

	mu  sync.Mutex // held while a member's socket is read, and while it is closed
	buf []byte     // what a read reads into: the poller reads one socket at a time
}

const (
	rawPollBatch = 32
	rawPollNap   = 500 * time.Microsecond
)

// newRawPollers starts one poller per core; nil where there is no poller.
func newRawPollers() (*rawPollers, error) {
	if !netpoll.Supported {
		return nil, nil
	}
	rp := &rawPollers{}
	for range runtime.GOMAXPROCS(0) {
		p, err := netpoll.New(netpoll.Config{Nap: rawPollNap, NapBelow: rawPollBatch})
		if err != nil {
			rp.stop()
			return nil, fmt.Errorf("bench: %w", err)
		}
		rp.ps = append(rp.ps, &rawPoller{p: p, buf: make([]byte, 64<<10)})
		go p.Run()
	}
	return rp, nil
}

// add takes c's socket out of Go's runtime and has one of the pollers read it from now on;
// c.done is closed when the poller lets go of it (the connection ended, or remove). Nothing may
// be buffered for c yet: the server sends nothing between its handshake answer and the LoginAck.
func (rp *rawPollers) add(c *rawClient) error {
	fd, err := netpoll.Detach(c.nc)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	p := rp.ps[int(rp.next.Add(1))%len(rp.ps)]
	c.poll, c.pollID, c.fd = p, p.p.NewID(), fd
	if err := p.p.Add(fd, c.pollID, func() { p.readable(c) }, netpoll.Level); err != nil {
		p.remove(c)
		return fmt.Errorf("bench: epoll: %w", err)
	}
	return nil
}

// readable reads what c's socket holds, up to the poller's buffer, and acts on the whole
// frames in it. It runs on the poller's goroutine.
func (p *rawPoller) readable(c *rawClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.dropped {
		return // an event that was on its way when c was removed
	}
	n, eof, err := netpoll.ReadNow(c.fd, p.buf)
	switch {
	case err != nil:
		err = fmt.Errorf("connection closed: %w", err)
	case eof:
		err = errors.New("connection closed: EOF")
	case n > 0:
		err = c.feed(p.buf[:n])
	}
	if err != nil {
		c.fail(err)
		p.dropLocked(c)
	}
}

// remove stops reading c and closes its socket, after a read in progress.
func (p *rawPoller) remove(c *rawClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(c)
}

// dropLocked takes c out of the poller and closes its socket. Caller holds p.mu.
func (p *rawPoller) dropLocked(c *rawClient) {
	if c.dropped {
		return
	}
	c.dropped = true
	p.p.Remove(c.pollID)
	_ = c.fd.Close() // after a write in progress; the kernel drops it from the epoll set
	close(c.done)
}

// writePolled writes one frame to a polled member's socket: length-prefixed over TCP, or a
// masked WebSocket frame of opcode op.
func (c *rawClient) writePolled(op byte, b []byte) error {
	var frame []byte
	if c.isWS {
		var mask [4]byte
		_, _ = rand.Read(mask[:])
		frame = append(frame, 0x80|op)
		switch n := len(b); {
		case n < 126:
			frame = append(frame, 0x80|byte(n))
		case n < 1<<16:
			frame = binary.BigEndian.AppendUint16(append(frame, 0x80|126), uint16(n))
		default:
			frame = binary.BigEndian.AppendUint64(append(frame, 0x80|127), uint64(n))
		}
		frame = append(frame, mask[:]...)
		for i, x := range b {
			frame = append(frame, x^mask[i%4])
		}
	} else {
		frame = lengthPrefixed(b)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	deadline := time.Now().Add(rawWriteTimout)
	for len(frame) > 0 {
		n, err := netpoll.WritevNow(c.fd, nil, frame)
		switch {
		case errors.Is(err, netpoll.ErrClosed):
			return errors.New("connection closed")
		case err != nil:
			return err
		case n == 0:
			if time.Now().After(deadline) {
				return errors.New("write timed out")
			}
			time.Sleep(time.Millisecond)
		default:
			frame = frame[n:]
		}
	}
	return nil
}

// stop ends the pollers, once the members they read are closed.
func (rp *rawPollers) stop() {
	rp.stopOnce.Do(func() {
		for _, p := range rp.ps {
			p.p.Stop()
		}
	})
}
