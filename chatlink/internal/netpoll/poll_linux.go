//go:build linux

package netpoll

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

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
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netpoll: epoll: %w", err)
	}
	p := &Poller{epfd: epfd, file: os.NewFile(uintptr(epfd), "netpoll"), wake: wake, regs: map[uint64]func(){}, done: make(chan struct{})}
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

// Run waits for events until Stop.
func (p *Poller) Run() {
	defer close(p.done)
	rc, err := p.file.SyscallConn()
	if err != nil {
		panic(fmt.Sprintf("netpoll: %v", err)) // only a bug gets here: the file is open until Stop
	}
	events := make([]unix.EpollEvent, 128)
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
	_ = p.file.Close() // closes epfd
	_ = unix.Close(p.wake)
}

// The system calls that never wait (epoll_ctl, epoll_wait with no timeout, and the reads and
// writes of ReadNow and WritevNow on non-blocking sockets) are raw calls. An ordinary call
// tells the runtime it may block: it wakes the runtime's monitor thread when the process was
// idle (which then checks every 20 µs while the process is busy) and lets the monitor hand the
// goroutine's P to another thread when the call takes longer than 20 µs, as a write on
// loopback does (the kernel runs the receiver's side in it). A login made four such calls.

// errnoErr is errno as an error, nil for 0.
func errnoErr(errno unix.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}

// ReadNow reads once from a socket without waiting. Nothing there yet (EAGAIN) is n == 0
// with eof false and a nil error; the peer's end of the stream is eof. buf must not be empty.
func ReadNow(rc syscall.RawConn, buf []byte) (n int, eof bool, err error) {
	var rerr error
	cerr := rc.Read(func(fd uintptr) bool {
		for {
			r, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			if errno != unix.EINTR {
				n, rerr = int(r), errnoErr(errno)
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
	var iov [2]unix.Iovec
	k := 0
	for _, p := range [2][]byte{hdr, b} {
		if len(p) > 0 {
			iov[k].Base = &p[0]
			iov[k].SetLen(len(p))
			k++
		}
	}
	if k == 0 {
		return 0, nil
	}
	cerr := rc.Write(func(fd uintptr) bool {
		for {
			r, _, errno := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
			if errno != unix.EINTR {
				n, werr = int(r), errnoErr(errno)
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
