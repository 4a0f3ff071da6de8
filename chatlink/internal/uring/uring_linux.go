//go:build linux

package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ring is an io_uring instance that sends a batch of buffers, each to its own socket, in one
// system call: a batch of writes enters the kernel once instead of once per socket. On this
// kind of machine that halves the kernel's cost of a small loopback write (BenchmarkRingSend).
// Sends never wait: a socket whose buffer is full completes with EAGAIN and the caller keeps
// the rest. A Ring is used by one goroutine at a time.
type Ring struct {
	fd      int
	entries uint32
	sqMem   []byte // the rings, one mapping (IORING_FEAT_SINGLE_MMAP)
	sqeMem  []byte // the submission entries

	sqTail, sqMask *uint32
	cqHead, cqTail *uint32
	cqMask         *uint32
	sqes           unsafe.Pointer // [entries]sqe, 64 bytes each
	cqes           unsafe.Pointer // [cq entries]cqe, 16 bytes each
}

// ringParams is struct io_uring_params.
type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  ringOffsets // head tail ring_mask ring_entries flags dropped array resv1 user_addr
	cqOff                                                                  ringOffsets // head tail ring_mask ring_entries overflow cqes flags resv1 user_addr
}

type ringOffsets struct {
	head, tail, mask, entries, flags, dropped, array, resv1 uint32
	userAddr                                                uint64
}

const (
	sysIOURingSetup = 425
	sysIOURingEnter = 426

	ringSetupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL: a bad entry does not stop the rest
	ringFeatSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	ringEnterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	ringOffSQEs        = 0x10000000
	ringOpSend         = 26 // IORING_OP_SEND

	sqeSize = 64
	cqeSize = 16
)

// NewRing sets up a ring for batches of up to entries sends.
func NewRing(entries uint32) (*Ring, error) {
	var p ringParams
	p.flags = ringSetupSubmitAll
	fd, _, errno := unix.Syscall(sysIOURingSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL { // a kernel before 5.18 has no SUBMIT_ALL
		p = ringParams{}
		fd, _, errno = unix.Syscall(sysIOURingSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	}
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), entries: p.sqEntries}
	if p.features&ringFeatSingleMmap == 0 {
		r.Close()
		return nil, errors.New("io_uring: the kernel is too old (no IORING_FEAT_SINGLE_MMAP)")
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqesOff()+p.cqEntries*cqeSize)
	var err error
	r.sqMem, err = unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	r.sqeMem, err = unix.Mmap(r.fd, ringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	base := unsafe.Pointer(&r.sqMem[0])
	at := func(off uint32) *uint32 { return (*uint32)(unsafe.Add(base, off)) }
	r.sqTail, r.sqMask = at(p.sqOff.tail), at(p.sqOff.mask)
	r.cqHead, r.cqTail, r.cqMask = at(p.cqOff.head), at(p.cqOff.tail), at(p.cqOff.mask)
	r.cqes = unsafe.Add(base, p.cqOff.cqesOff())
	r.sqes = unsafe.Pointer(&r.sqeMem[0])
	for i := range p.sqEntries { // entry i of the array names sqe i, for good
		*at(p.sqOff.array + 4*i) = i
	}
	return r, nil
}

// cqesOff is where the completion entries start: io_cqring_offsets has cqes where
// io_sqring_offsets has dropped.
func (o ringOffsets) cqesOff() uint32 { return o.dropped }

// Close releases the ring.
func (r *Ring) Close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
	}
	if r.sqMem != nil {
		_ = unix.Munmap(r.sqMem)
	}
	_ = unix.Close(r.fd)
}

// Send writes bufs[i] to socket fds[i] for every i, without waiting, and sets res[i] to the
// bytes the socket took or to a negative errno (-EAGAIN when its buffer was full). len(fds) is
// at most the ring's entries. The caller keeps every descriptor open until Send returns. An
// error means the ring failed (only a bug gets there): some of the buffers may have gone out.
func (r *Ring) Send(fds []int32, bufs [][]byte, res []int32) error {
	k := uint32(len(fds))
	tail := *r.sqTail // only this goroutine writes it
	mask := *r.sqMask
	for i, fd := range fds {
		s := unsafe.Add(r.sqes, ((tail+uint32(i))&mask)*sqeSize)
		*(*[sqeSize]byte)(s) = [sqeSize]byte{}
		*(*uint8)(s) = ringOpSend
		*(*int32)(unsafe.Add(s, 4)) = fd
		*(*uint64)(unsafe.Add(s, 16)) = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(bufs[i]))))
		*(*uint32)(unsafe.Add(s, 24)) = uint32(len(bufs[i]))
		*(*uint32)(unsafe.Add(s, 28)) = unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL // never wait, never SIGPIPE
		*(*uint64)(unsafe.Add(s, 32)) = uint64(i)
	}
	atomic.StoreUint32(r.sqTail, tail+k) // publishes the entries

	// The sends run inline as the kernel takes them; every completion is normally there when
	// the call returns. Should one not be, the second call waits for it (it cannot wait long:
	// no send waits for its socket).
	toSubmit, got := k, uint32(0)
	for got < k {
		flags, wait := uintptr(0), uintptr(0)
		if toSubmit == 0 {
			flags, wait = ringEnterGetEvents, 1
		}
		var n uintptr
		var errno unix.Errno
		if wait == 0 {
			// Submitting only, which never waits: a raw call, so the runtime does not hand
			// this goroutine's P to another thread while a long batch is in the kernel.
			n, _, errno = unix.RawSyscall6(sysIOURingEnter, uintptr(r.fd), uintptr(toSubmit), 0, 0, 0, 0)
		} else {
			n, _, errno = unix.Syscall6(sysIOURingEnter, uintptr(r.fd), uintptr(toSubmit), wait, flags, 0, 0)
		}
		switch errno {
		case 0:
			toSubmit -= uint32(n)
		case unix.EINTR, unix.EAGAIN, unix.EBUSY:
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		head, ctail, cmask := *r.cqHead, atomic.LoadUint32(r.cqTail), *r.cqMask
		for ; head != ctail; head++ {
			c := unsafe.Add(r.cqes, (head&cmask)*cqeSize)
			res[*(*uint64)(c)] = *(*int32)(unsafe.Add(c, 8))
			got++
		}
		atomic.StoreUint32(r.cqHead, head)
	}
	return nil
}

// WritePlain writes bufs[i] to socket fds[i] for every i as Ring.Send does, with a write(2)
// each: where no ring is to be had, the caller's batch goes out all the same.
func WritePlain(fds []int32, bufs [][]byte, res []int32) {
	for i, fd := range fds {
		res[i] = writeNow(fd, bufs[i])
	}
}

// writeNow writes b to socket fd without waiting and returns what write(2) did: the bytes
// the socket took, or a negative errno (-EAGAIN when its buffer is full).
func writeNow(fd int32, b []byte) int32 {
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
