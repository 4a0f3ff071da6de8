// Package uring sends a batch of buffers, each to its own socket, in one system call through
// io_uring, and keeps a bounded pool of rings for the ChatLink's writers to share.
//
// It knows descriptors and bytes, not connections: it never frames, queues or retries what a
// socket did not take (the caller does), and never opens or closes a socket. Linux 5.6 and
// later; elsewhere NewRing and NewRings fail and the caller writes plainly.
package uring

import "sync"

// Entries is a pooled ring's size: the most sends one batch, and one system call, carries.
const Entries = 256

// Rings is a pool of rings of Entries each. A writer takes one for each batch it sends; there
// are at most a bound (each holds a descriptor and about 28 KB of mapped memory), and a writer
// that finds them all in use waits for one, which takes no longer than a batch's send.
type Rings struct {
	slots chan struct{} // one token per ring in use

	mu     sync.Mutex // guards the fields below
	free   []*Ring
	closed bool
}

// NewRings checks that this kernel lets the process use io_uring for sends, and returns a
// pool of at most limit rings.
func NewRings(limit int) (*Rings, error) {
	r, err := NewRing(Entries)
	if err != nil {
		return nil, err
	}
	return &Rings{slots: make(chan struct{}, limit), free: []*Ring{r}}, nil
}

// Get returns a ring for the caller's use until Put.
func (rs *Rings) Get() (*Ring, error) {
	rs.slots <- struct{}{}
	rs.mu.Lock()
	if k := len(rs.free); k > 0 {
		r := rs.free[k-1]
		rs.free = rs.free[:k-1]
		rs.mu.Unlock()
		return r, nil
	}
	rs.mu.Unlock()
	r, err := NewRing(Entries)
	if err != nil {
		<-rs.slots
	}
	return r, err
}

// Put gives back a ring Get returned.
func (rs *Rings) Put(r *Ring) {
	rs.mu.Lock()
	if rs.closed {
		r.Close()
	} else {
		rs.free = append(rs.free, r)
	}
	rs.mu.Unlock()
	<-rs.slots
}

// Close releases the free rings; one in use is released when it is put back.
func (rs *Rings) Close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	for _, r := range rs.free {
		r.Close()
	}
	rs.free = nil
}
