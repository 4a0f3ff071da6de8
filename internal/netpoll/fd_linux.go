//go:build linux

package netpoll

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// FD is a socket taken out of Go's runtime (Detach): a descriptor the runtime's poller no
// longer watches, so that data arriving on it costs the runtime nothing, for an owner that
// reads it only when a Poller says so. It is a syscall.RawConn for Add, Arm, ReadNow and
// WritevNow, whose functions run at once and are never asked to wait: there is no runtime
// poller behind it to wait in.
type FD struct {
	mu sync.RWMutex // held for reading while a call uses fd, and for writing while Close closes it
	fd int          // -1 once closed
}

var _ syscall.RawConn = (*FD)(nil)

// ErrClosed is what an FD's calls return once it is closed.
var ErrClosed = errors.New("netpoll: socket closed")

// errWouldWait is what Read and Write return when their function asks to wait for readiness.
var errWouldWait = errors.New("netpoll: a detached socket cannot wait")

// Detach takes c's socket out of Go's runtime: it returns a duplicate of its descriptor and
// closes c, which takes the original out of the runtime's poller. The socket stays
// non-blocking. Nothing c had read ahead is lost: a net.Conn reads only when asked.
func Detach(c net.Conn) (*FD, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errors.New("netpoll: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	if cerr := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("netpoll: dup: %w", err)
	}
	_ = c.Close() // the duplicate keeps the connection open
	return &FD{fd: fd}, nil
}

// Close closes the socket, once no call is using it; the kernel drops it from any epoll set.
// Closing twice is harmless.
func (f *FD) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}

// Control runs fn with the descriptor.
func (f *FD) Control(fn func(fd uintptr)) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.fd < 0 {
		return ErrClosed
	}
	fn(uintptr(f.fd))
	return nil
}

// Read runs fn with the descriptor once; fn returning false (wait until readable) is an error.
func (f *FD) Read(fn func(fd uintptr) (done bool)) error { return f.once(fn) }

// Write runs fn with the descriptor once; fn returning false (wait until writable) is an error.
func (f *FD) Write(fn func(fd uintptr) (done bool)) error { return f.once(fn) }

func (f *FD) once(fn func(fd uintptr) bool) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.fd < 0 {
		return ErrClosed
	}
	if !fn(uintptr(f.fd)) {
		return errWouldWait
	}
	return nil
}

// readNow is ReadNow for a detached socket.
func (f *FD) readNow(buf []byte) (int, bool, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.fd < 0 {
		return 0, false, ErrClosed
	}
	return readResult(readRaw(uintptr(f.fd), buf))
}
