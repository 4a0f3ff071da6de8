package chatlink

import (
	"sync"
	"time"

	pb "roomcast/proto/roomcastpb"
)

// eventBatcher collects presence events and publishes them in batches.
type eventBatcher struct {
	n *Node

	mu      sync.Mutex // guards pending
	pending []*pb.SessionEvent
}

const presenceFlushEvery = 100 * time.Millisecond

func (b *eventBatcher) add(ev *pb.SessionEvent) {
	b.mu.Lock()
	b.pending = append(b.pending, ev)
	b.mu.Unlock()
}

func (b *eventBatcher) loop() {
	t := time.NewTicker(presenceFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-b.n.ctx.Done():
			return
		case <-t.C:
			b.flush()
		}
	}
}

func (b *eventBatcher) flush() {
	// Session stream hook (stream.go): events, snapshots and reports share one ordered sequence.
	b.n.stream.mu.Lock()
	defer b.n.stream.mu.Unlock()
	b.flushLocked()
}

// flushLocked publishes the pending events. Caller holds b.n.stream.mu.
func (b *eventBatcher) flushLocked() {
	b.mu.Lock()
	evs := b.pending
	b.pending = nil
	b.mu.Unlock()
	if len(evs) == 0 {
		return
	}
	if err := b.n.publishEventsLocked(evs); err != nil {
		b.n.log.Warn("presence events not published", "events", len(evs), "err", err)
	}
}
