//go:build linux

package netpoll

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Supported says whether this platform has the poller.
const Supported = true

// Poller tells which idle sockets have become readable, from one epoll instance. Sockets are
// registered one-shot: after an event, nothing more comes for that socket until it is armed
// again, so at most one read of a connection runs at a time.
//
// Go's runtime keeps its own epoll registration of every socket; this second one only says
// when to look. The reads themselves go through syscall.RawConn (ReadNow), so they hold the
// runtime's reference on the descriptor and never race its close.
type Poller struct {
	epfd int
	ep   syscall.RawConn // epfd in Go's own poller: Run parks there, not in epoll_wait
	file *os.File        // owns epfd
	wake int             // an eventfd that ends Run

	mu   sync.Mutex        // guards regs
	regs map[uint64]func() // by registration id
	next atomic.Uint64     // the last registration id handed out

	done chan struct{}
}

// wakeID is the epoll data of the eventfd.
const wakeID = 0

// New returns a poller; Run waits for its events.
func New() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("netpoll: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setPollID(&ev, wakeID)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	// An epoll instance is itself readable while it has events, so Go's poller can say when
	// to look: Run's goroutine then parks like any other instead of holding a thread (and,
	// until the runtime takes it back, a P) in a blocking epoll_wait, whose every return costs
	// a thread wake-up and sets the runtime's monitor polling every 20 µs again.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	file := os.NewFile(uintptr(epfd), "netpoll-epoll")
	ep, err := file.SyscallConn()
	if err != nil {
		_ = file.Close()
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	p := &Poller{epfd: epfd, ep: ep, file: file, wake: wake, regs: map[uint64]func(){}, done: make(chan struct{})}
	p.next.Store(wakeID)
	return p, nil
}

func setPollID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func pollID(ev *unix.EpollEvent) uint64 { return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32 }

// pollEvents are what a registration waits for: data, or the peer going away.
const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// NewID returns a registration id for Add.
func (p *Poller) NewID() uint64 { return p.next.Add(1) }

// Add registers a socket under id, armed: f runs, on a goroutine of its own, once the socket
// is readable (or already is), and again after each Arm.
func (p *Poller) Add(rc syscall.RawConn, id uint64, f func()) error {
	p.mu.Lock()
	p.regs[id] = f
	p.mu.Unlock()
	if err := p.ctl(rc, unix.EPOLL_CTL_ADD, id); err != nil {
		p.Remove(id)
		return err
	}
	return nil
}

// Arm asks for one more readable event of a registered socket. It fails once the socket is
// closed.
func (p *Poller) Arm(rc syscall.RawConn, id uint64) error {
	return p.ctl(rc, unix.EPOLL_CTL_MOD, id)
}

func (p *Poller) ctl(rc syscall.RawConn, op int, id uint64) error {
	ev := unix.EpollEvent{Events: pollEvents}
	setPollID(&ev, id)
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = unix.EpollCtl(p.epfd, op, int(fd), &ev) }); cerr != nil {
		return cerr
	}
	return err
}

// Remove forgets a registration. The kernel drops the socket from the epoll set when it is
// closed; an event already on its way finds no registration and is ignored.
func (p *Poller) Remove(id uint64) {
	p.mu.Lock()
	delete(p.regs, id)
	p.mu.Unlock()
}

// Run waits for events until Stop.
func (p *Poller) Run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		var n int
		var err error
		// Take what is ready without waiting; with nothing, park in Go's poller until the
		// epoll instance is readable, then look again.
		cerr := p.ep.Read(func(fd uintptr) bool {
			for {
				n, err = unix.EpollWait(int(fd), events, 0)
				if err != unix.EINTR {
					return err != nil || n > 0
				}
			}
		})
		if cerr == nil && err != nil {
			cerr = err
		}
		if cerr != nil {
			panic(fmt.Sprintf("netpoll: epoll_wait: %v", cerr)) // only a bug gets here (EBADF, EFAULT, EINVAL)
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

// Stop ends Run and releases the epoll instance. Registered sockets are not touched.
func (p *Poller) Stop() {
	var one = [8]byte{1}
	_, _ = unix.Write(p.wake, one[:])
	<-p.done
	_ = p.file.Close()
	_ = unix.Close(p.wake)
}

// ReadNow reads once from a socket without waiting. Nothing there yet (EAGAIN) is n == 0
// with eof false and a nil error; the peer's end of the stream is eof. buf must not be empty.
func ReadNow(rc syscall.RawConn, buf []byte) (n int, eof bool, err error) {
	var rerr error
	cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), buf)
			if rerr != unix.EINTR {
				return true // never wait in the runtime's poller: the Poller said when
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

// WritevNow writes hdr and b to a socket without waiting: it returns how much the socket took
// (0 when its buffer is full), and an error only for a broken or closed connection.
func WritevNow(rc syscall.RawConn, hdr, b []byte) (int, error) {
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
