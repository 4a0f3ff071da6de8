//go:build linux

package loadgen

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rawPollers read the raw members' sockets (--client raw) from epoll sets of the bench's own
// instead of a reader goroutine per member. A reader goroutine reads through Go's poller, which
// parks and wakes it for every frame; in the big fan-out runs that took more of the shared
// cores than the server did. Here a member's socket, once logged in, leaves Go's runtime (the
// bench keeps a duplicate of the descriptor and closes the net.Conn, which takes it out of Go's
// poller), one goroutine per core waits on its own epoll set, level-triggered, and reads each
// readable socket once, parsing the frames in place; an incomplete frame's bytes wait in its
// member. When a wait brings back only a few sockets the goroutine sleeps rawPollNap before the
// next, so that one epoll_wait serves many frames: the latencies the bench reports may be up to
// that much later than a client would have seen them, never earlier.
type rawPollers struct {
	ps       []*rawPoller
	next     atomic.Uint32
	stopOnce sync.Once
}

type rawPoller struct {
	epfd int
	wake int // an eventfd that ends run

	mu   sync.Mutex            // guards regs, and is held while a member's socket is read
	regs map[uint64]*rawClient // by registration id
	last uint64                // the last registration id handed out

	done chan struct{}
}

const (
	rawPollWake  = 0 // the epoll data of the eventfd
	rawPollBatch = 32
	rawPollNap   = 500 * time.Microsecond
)

// newRawPollers starts one poller per core.
func newRawPollers() (*rawPollers, error) {
	rp := &rawPollers{}
	for range runtime.GOMAXPROCS(0) {
		p, err := newRawPoller()
		if err != nil {
			rp.stop()
			return nil, err
		}
		rp.ps = append(rp.ps, p)
		go p.run()
	}
	return rp, nil
}

func newRawPoller() (*rawPoller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("bench: epoll: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("bench: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setRawPollID(&ev, rawPollWake)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("bench: epoll: %w", err)
	}
	return &rawPoller{epfd: epfd, wake: wake, regs: map[uint64]*rawClient{}, done: make(chan struct{})}, nil
}

func setRawPollID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func rawPollID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// add takes c's socket out of Go's runtime and has one of the pollers read it from now on;
// c.done is closed when the poller lets go of it (the connection ended, or remove). Nothing may
// be buffered for c yet: the server sends nothing between its handshake answer and the LoginAck.
func (rp *rawPollers) add(c *rawClient) error {
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return errors.New("bench: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	if cerr := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: dup: %w", err)
	}
	_ = c.nc.Close() // the duplicate keeps the connection open
	p := rp.ps[int(rp.next.Add(1))%len(rp.ps)]
	p.mu.Lock()
	p.last++
	id := p.last
	p.regs[id] = c
	c.poll, c.pollID, c.fd = p, id, fd
	p.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP}
	setRawPollID(&ev, id)
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		p.remove(c)
		return fmt.Errorf("bench: epoll: %w", err)
	}
	return nil
}

// remove stops reading c and closes its socket, after a read in progress.
func (p *rawPoller) remove(c *rawClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(c)
}

// dropLocked takes c out of the set and closes its socket. Caller holds p.mu.
func (p *rawPoller) dropLocked(c *rawClient) {
	if p.regs[c.pollID] != c {
		return
	}
	delete(p.regs, c.pollID)
	_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	c.wmu.Lock() // no write is using the descriptor
	_ = unix.Close(c.fd)
	c.fd = -1
	c.wmu.Unlock()
	close(c.done)
}

func (p *rawPoller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			panic(fmt.Sprintf("bench: epoll_wait: %v", err)) // only a bug gets here
		}
		for i := range events[:n] {
			id := rawPollID(&events[i])
			if id == rawPollWake {
				return
			}
			p.mu.Lock()
			if c := p.regs[id]; c != nil {
				if err := c.readOnce(buf); err != nil {
					c.fail(err)
					p.dropLocked(c)
				}
			}
			p.mu.Unlock()
		}
		if n < rawPollBatch {
			time.Sleep(rawPollNap)
		}
	}
}

// readOnce reads what c's socket holds, up to len(buf), and acts on the whole frames in it.
// Caller holds c.poll.mu.
func (c *rawClient) readOnce(buf []byte) error {
	for {
		n, err := unix.Read(c.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return fmt.Errorf("connection closed: %w", err)
		case n == 0:
			return errors.New("connection closed: EOF")
		}
		return c.feed(buf[:n])
	}
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
		if c.fd < 0 {
			return errors.New("connection closed")
		}
		n, err := unix.Write(c.fd, frame)
		switch {
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			if time.Now().After(deadline) {
				return errors.New("write timed out")
			}
			time.Sleep(time.Millisecond)
		case err != nil:
			return err
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
			var one = [8]byte{1}
			_, _ = unix.Write(p.wake, one[:])
			<-p.done
			_ = unix.Close(p.epfd)
			_ = unix.Close(p.wake)
		}
	})
}
