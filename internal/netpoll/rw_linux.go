//go:build linux

package netpoll

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
	if f, ok := rc.(*FD); ok {
		return f.readNow(buf) // the same without a closure, which rc.Read would put on the heap
	}
	var errno unix.Errno
	cerr := rc.Read(func(fd uintptr) bool {
		n, errno = readRaw(fd, buf)
		return true // never wait in the runtime's poller: the Poller said when
	})
	if cerr != nil {
		return 0, false, cerr
	}
	return readResult(n, errno)
}

// readRaw reads once from a non-blocking descriptor.
func readRaw(fd uintptr, buf []byte) (int, unix.Errno) {
	for {
		r, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		if errno != unix.EINTR {
			return int(r), errno
		}
	}
}

// readResult is ReadNow's answer for what readRaw returned.
func readResult(n int, errno unix.Errno) (int, bool, error) {
	switch {
	case errno == unix.EAGAIN:
		return 0, false, nil
	case errno != 0:
		return 0, false, errno
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
