//go:build linux

package chatlink

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is an io_uring instance that sends a batch of frames, each to its own socket, in one
// system call: a phase group's writes enter the kernel once per batch instead of once per
// member. On this kind of machine that halves the kernel's cost of a small loopback write
// (BenchmarkRingSend). Sends never wait: a socket whose buffer is full completes with EAGAIN
// and the caller queues the rest (sockWriter). A ring is used by one goroutine at a time.
type ring struct {
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

func newRing(entries uint32) (*ring, error) {
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
	r := &ring{fd: int(fd), entries: p.sqEntries}
	if p.features&ringFeatSingleMmap == 0 {
		r.close()
		return nil, errors.New("io_uring: the kernel is too old (no IORING_FEAT_SINGLE_MMAP)")
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqesOff()+p.cqEntries*cqeSize)
	var err error
	r.sqMem, err = unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	r.sqeMem, err = unix.Mmap(r.fd, ringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
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

func (r *ring) close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
	}
	if r.sqMem != nil {
		_ = unix.Munmap(r.sqMem)
	}
	_ = unix.Close(r.fd)
}

// send writes bufs[i] to socket fds[i] for every i, without waiting, and sets res[i] to the
// bytes the socket took (0 when its buffer was full) or to a negative errno. len(fds) is at
// most r.entries. The caller keeps every descriptor open until send returns.
func (r *ring) send(fds []int32, bufs [][]byte, res []int32) error {
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

// rings is the node's rings. A room's write takes one for each batch it sends; there are at
// most maxRings (each holds a descriptor and about 28 KB of mapped memory), and a write that
// finds them all in use waits for one, which takes no longer than a batch's send.
type rings struct {
	slots  chan struct{} // one token per ring in use
	mu     sync.Mutex
	free   []*ring
	closed bool
}

// maxRings bounds the rings: more writers than cores cannot send at once anyway.
var maxRings = 2 * runtime.GOMAXPROCS(0)

// newRings checks that this kernel lets the process use io_uring for sends.
func newRings() (*rings, error) {
	r, err := newRing(ringEntries)
	if err != nil {
		return nil, err
	}
	return &rings{slots: make(chan struct{}, maxRings), free: []*ring{r}}, nil
}

// get returns a ring for the caller's use until put.
func (rs *rings) get() (*ring, error) {
	rs.slots <- struct{}{}
	rs.mu.Lock()
	if k := len(rs.free); k > 0 {
		r := rs.free[k-1]
		rs.free = rs.free[:k-1]
		rs.mu.Unlock()
		return r, nil
	}
	rs.mu.Unlock()
	r, err := newRing(ringEntries)
	if err != nil {
		<-rs.slots
	}
	return r, err
}

func (rs *rings) put(r *ring) {
	rs.mu.Lock()
	if rs.closed {
		r.close()
	} else {
		rs.free = append(rs.free, r)
	}
	rs.mu.Unlock()
	<-rs.slots
}

// close releases the free rings; one in use is released when it is put back.
func (rs *rings) close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	for _, r := range rs.free {
		r.close()
	}
	rs.free = nil
}
