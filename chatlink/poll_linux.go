//go:build linux

package chatlink

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// pollSupported says whether this platform has the poller; elsewhere every WebSocket
// connection has a reader goroutine.
const pollSupported = true

// poller tells the node which idle sockets have become readable, from one epoll instance, so
// that an idle connection needs no goroutine of its own: a parked reader goroutine costs a
// 2 KiB stack and its runtime bookkeeping, about half of what an idle connection costs
// otherwise. Sockets are registered one-shot: after an event, nothing more comes for that
// socket until it is armed again, so at most one read of a connection runs at a time.
//
// Go's runtime keeps its own epoll registration of every socket; this second one only says
// when to look. The reads themselves go through syscall.RawConn, so they hold the runtime's
// reference on the descriptor and never race its close.
type poller struct {
	epfd int
	wake int // an eventfd that ends run

	mu   sync.Mutex        // guards regs
	regs map[uint64]pollFn // by registration id
	next atomic.Uint64     // the last registration id handed out

	done chan struct{}
}

// pollFn is called, on a goroutine of its own, when a registered socket is readable.
type pollFn func()

// wakeID is the epoll data of the eventfd.
const wakeID = 0

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("chatlink: epoll: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("chatlink: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setPollID(&ev, wakeID)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("chatlink: epoll: %w", err)
	}
	p := &poller{epfd: epfd, wake: wake, regs: map[uint64]pollFn{}, done: make(chan struct{})}
	p.next.Store(wakeID)
	return p, nil
}

func setPollID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func pollID(ev *unix.EpollEvent) uint64 { return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32 }

// pollEvents are what a registration waits for: data, or the peer going away.
const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// newID returns a registration id for add.
func (p *poller) newID() uint64 { return p.next.Add(1) }

// add registers a socket under id, armed: f runs once it is readable (or already is).
func (p *poller) add(rc syscall.RawConn, id uint64, f pollFn) error {
	p.mu.Lock()
	p.regs[id] = f
	p.mu.Unlock()
	if err := p.ctl(rc, unix.EPOLL_CTL_ADD, id); err != nil {
		p.remove(id)
		return err
	}
	return nil
}

// arm asks for one more readable event of a registered socket. It fails once the socket is
// closed.
func (p *poller) arm(rc syscall.RawConn, id uint64) error {
	return p.ctl(rc, unix.EPOLL_CTL_MOD, id)
}

func (p *poller) ctl(rc syscall.RawConn, op int, id uint64) error {
	ev := unix.EpollEvent{Events: pollEvents}
	setPollID(&ev, id)
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = unix.EpollCtl(p.epfd, op, int(fd), &ev) }); cerr != nil {
		return cerr
	}
	return err
}

// remove forgets a registration. The kernel drops the socket from the epoll set when it is
// closed; an event already on its way finds no registration and is ignored.
func (p *poller) remove(id uint64) {
	p.mu.Lock()
	delete(p.regs, id)
	p.mu.Unlock()
}

// run waits for events until stop.
func (p *poller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			panic(fmt.Sprintf("chatlink: epoll_wait: %v", err)) // only a bug gets here (EBADF, EFAULT, EINVAL)
		}
		for i := range events[:n] {
			id := pollID(&events[i])
			if id == wakeID {
				return
			}
			p.mu.Lock()
			f := p.regs[id]
			p.mu.Unlock()
			if f != nil {
				go f()
			}
		}
	}
}

// stop ends run and releases the epoll instance. Registered sockets are not touched.
func (p *poller) stop() {
	var one = [8]byte{1}
	_, _ = unix.Write(p.wake, one[:])
	<-p.done
	_ = unix.Close(p.epfd)
	_ = unix.Close(p.wake)
}

// readRaw reads once from a socket without waiting. Nothing there yet (EAGAIN) is n == 0
// with eof false and a nil error; the peer's end of the stream is eof. buf must not be empty.
func readRaw(rc syscall.RawConn, buf []byte) (n int, eof bool, err error) {
	var rerr error
	cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), buf)
			if rerr != unix.EINTR {
				return true // never wait in the runtime's poller: the node's poller said when
			}
		}
	})
	switch {
	case cerr != nil:
		return 0, false, cerr
	case rerr == unix.EAGAIN:
		return 0, false, nil
	case rerr != nil:
		return 0, false, rerr
	case n == 0:
		return 0, true, nil
	}
	return n, false, nil
}

// writevNow writes hdr and b to a socket without waiting: it returns how much the socket took
// (0 when its buffer is full), and an error only for a broken or closed connection.
func writevNow(rc syscall.RawConn, hdr, b []byte) (int, error) {
	var n int
	var werr error
	cerr := rc.Write(func(fd uintptr) bool {
		iov := [][]byte{hdr, b}
		for {
			n, werr = unix.Writev(int(fd), iov)
			if werr != unix.EINTR {
				return true
			}
		}
	})
	switch {
	case cerr != nil:
		return 0, cerr
	case werr == unix.EAGAIN:
		return 0, nil
	case werr != nil:
		return 0, werr
	}
	return n, nil
}

// plainWrite writes b to socket fd without waiting and returns what write(2) did: the bytes
// the socket took, or a negative errno (-EAGAIN when its buffer is full).
func plainWrite(fd int32, b []byte) int32 {
	for {
		n, err := unix.Write(int(fd), b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return -int32(err.(unix.Errno))
		}
		return int32(n)
	}
}
