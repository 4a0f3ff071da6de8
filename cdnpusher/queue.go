package cdnpusher

import (
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// pending is a segment ready for storage.
type pending struct {
	key    string
	body   []byte
	empty  bool                // a quiet window's segment
	closed time.Time           // real time its window was written out, for GiveUpAfter
	traced []trace.SpanContext // the traced batches its messages came in (window.traced)
}

// queue holds the segments waiting for a writer, oldest first, never more than its capacity:
// pushing onto a full queue drops the oldest, so the sealer never waits for storage.
type queue struct {
	mu     sync.Mutex // guards the fields below
	ready  sync.Cond  // signalled when items arrive or the queue closes; uses mu
	items  []pending  // a ring of len capacity
	head   int        // index of the oldest item
	n      int        // items in the ring
	closed bool       // no more pushes; pop drains what is left, then reports false
}

func newQueue(capacity int) *queue {
	q := &queue{items: make([]pending, capacity)}
	q.ready.L = &q.mu
	return q
}

// push appends s and returns the segment it dropped to make room, if it had to.
func (q *queue) push(s pending) (dropped pending, full bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == len(q.items) {
		dropped, full = q.items[q.head], true
		q.items[q.head] = pending{}
		q.head = (q.head + 1) % len(q.items)
		q.n--
	}
	q.items[(q.head+q.n)%len(q.items)] = s
	q.n++
	q.ready.Signal()
	return dropped, full
}

// pop waits for the oldest segment and takes it; false once the queue is closed and empty.
func (q *queue) pop() (pending, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n == 0 {
		if q.closed {
			return pending{}, false
		}
		q.ready.Wait()
	}
	s := q.items[q.head]
	q.items[q.head] = pending{}
	q.head = (q.head + 1) % len(q.items)
	q.n--
	return s, true
}

// close lets pop return false once the queue is empty.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.ready.Broadcast()
}

// len is how many segments wait.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
