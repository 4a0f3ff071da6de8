//go:build linux

package netpoll

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Supported says whether this platform has the poller.
const Supported = true

// Poller tells which registered sockets have become readable, from one epoll instance, and runs
// each one's function on Run's goroutine, one at a time: a function must not wait (one that
// reads, reads what is there with ReadNow; one that may wait hands the work to a goroutine).
//
// Go's runtime keeps its own epoll registration of a socket it has not let go of (Detach); this
// second one only says when to look. The reads themselves go through syscall.RawConn (ReadNow),
// so they hold the runtime's reference on the descriptor and never race its close.
type Poller struct {
	cfg  Config
	epfd int
	// file is epfd as a non-blocking file in the runtime's own poller, which tells Run when
	// events are waiting (an epoll instance is itself readable then). A goroutine blocked in
	// epoll_wait would hold its P in a system call; the runtime's monitor then takes the P
	// back after 20 µs, hands it to another thread and keeps waking every 20 µs while that
	// repeats, which cost a third of a login's CPU on an otherwise idle node.
	file *os.File
	wake int // an eventfd that ends Run

	mu   sync.Mutex        // guards regs
	regs map[uint64]func() // by registration id
	next atomic.Uint64     // the last registration id handed out

	done chan struct{}
}

// Config is how a Poller waits.
type Config struct {
	// Nap is how long Run sleeps after a wait that brought back fewer than NapBelow events,
	// so that the next wait finds more of them ready: fewer wake-ups when many sockets are
	// busy, for up to Nap more latency. Zero value means no nap: each event is handled as
	// soon as it comes.
	Nap time.Duration
	// NapBelow is the number of events below which Run naps. Zero value means 32.
	NapBelow int
}

func (c Config) withDefaults() Config {
	if c.NapBelow == 0 {
		c.NapBelow = 32
	}
	return c
}

// Mode is how a registration reports readiness.
type Mode int

const (
	// OneShot reports one event, then none until Arm: for an owner whose function hands the
	// read to a goroutine, so that at most one read of a socket runs at a time.
	OneShot Mode = iota
	// Level reports the socket on every wait while it is readable, with no Arm: for an owner
	// whose function reads in place, on Run's goroutine.
	Level
)

// wakeID is the epoll data of the eventfd.
const wakeID = 0

// maxEvents is how many events one wait brings back at most.
const maxEvents = 256

// New returns a poller; Run waits for its events.
func New(cfg Config) (*Poller, error) {
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
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	p := &Poller{cfg: cfg.withDefaults(), epfd: epfd, file: os.NewFile(uintptr(epfd), "netpoll"), wake: wake,
		regs: map[uint64]func(){}, done: make(chan struct{})}
	p.next.Store(wakeID)
	return p, nil
}

func setPollID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func pollID(ev *unix.EpollEvent) uint64 { return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32 }

// pollEvents are what a registration waits for: data, or the peer going away.
const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP

func (m Mode) events() uint32 {
	if m == OneShot {
		return pollEvents | unix.EPOLLONESHOT
	}
	return pollEvents
}

// NewID returns a registration id for Add.
func (p *Poller) NewID() uint64 { return p.next.Add(1) }

// Add registers a socket under id: f runs on Run's goroutine once the socket is readable (or
// already is), and then as mode says. rc is a net.Conn's (SyscallConn) or a detached socket.
func (p *Poller) Add(rc syscall.RawConn, id uint64, f func(), mode Mode) error {
	p.mu.Lock()
	p.regs[id] = f
	p.mu.Unlock()
	if err := p.ctl(rc, unix.EPOLL_CTL_ADD, id, mode.events()); err != nil {
		p.Remove(id)
		return err
	}
	return nil
}

// Arm asks for one more readable event of a OneShot registration. It fails once the socket is
// closed.
func (p *Poller) Arm(rc syscall.RawConn, id uint64) error {
	return p.ctl(rc, unix.EPOLL_CTL_MOD, id, OneShot.events())
}

func (p *Poller) ctl(rc syscall.RawConn, op int, id uint64, events uint32) error {
	ev := unix.EpollEvent{Events: events}
	setPollID(&ev, id)
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		_, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(p.epfd), uintptr(op), fd, uintptr(unsafe.Pointer(&ev)), 0, 0)
		err = errnoErr(errno)
	}); cerr != nil {
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

// Run waits for events and runs the registrations' functions until Stop.
func (p *Poller) Run() {
	defer close(p.done)
	rc, err := p.file.SyscallConn()
	if err != nil {
		panic(fmt.Sprintf("netpoll: %v", err)) // only a bug gets here: the file is open until Stop
	}
	events := make([]unix.EpollEvent, maxEvents)
	for {
		var n int
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				// epoll_pwait without a signal mask is epoll_wait, which arm64 lacks.
				r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
				if errno != unix.EINTR {
					n, werr = int(r), errnoErr(errno)
					return n > 0 || werr != nil // nothing yet: the runtime waits for the next event
				}
			}
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			panic(fmt.Sprintf("netpoll: epoll_wait: %v", err)) // only a bug gets here (EBADF, EFAULT, EINVAL)
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
				f()
			}
		}
		if p.cfg.Nap > 0 && n < p.cfg.NapBelow {
			time.Sleep(p.cfg.Nap)
		}
	}
}

// Stop ends Run and releases the epoll instance. Registered sockets are not touched.
func (p *Poller) Stop() {
	var one = [8]byte{1}
	_, _ = unix.Write(p.wake, one[:])
	<-p.done
	_ = p.file.Close() // closes epfd
	_ = unix.Close(p.wake)
}
