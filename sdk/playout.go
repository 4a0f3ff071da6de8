package sdk

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"roomcast/proto/clientpb"
)

// playQuantum is how close together play times are handed on in one go: a window's messages
// come out in about a hundred small batches instead of one burst or one wake-up each.
const playQuantum = 10 * time.Millisecond

// playout is the part of a delivery that merges the CDN path with the long connection. In CDN
// mode every message, whichever way it came, waits for its play time, its server time plus
// delay on the server's clock, in a heap ordered by (server time, id), and the player hands
// the messages on as their times come. delay covers what a segment takes to be written and
// polled (see cdnPoller.playDelay), so that a segment's messages and the pushed ones come out in
// one order, and a window's messages come out spread over the window as they were sent rather
// than in the burst in which their segment arrived. Outside CDN mode delay is 0 and messages go
// straight to the queue.
//
// Its fields are guarded by the delivery's mu.
type playout struct {
	delay    time.Duration // 0 outside CDN mode
	offset   time.Duration // the server's clock minus ours
	held     heldHeap
	played   *clientpb.Message // the last message handed on: one that sorts before it is late
	playWake chan struct{}     // one value: the earliest play time may have changed

	late, duplicates, fromSegments uint64 // for CDNStats
}

// heldHeap is a min-heap of messages by (server time, id).
type heldHeap []*clientpb.Message

func (h heldHeap) Len() int           { return len(h) }
func (h heldHeap) Less(i, j int) bool { return compareMessages(h[i], h[j]) < 0 }
func (h heldHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)        { *h = append(*h, x.(*clientpb.Message)) }
func (h *heldHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return m
}

// outLocked hands on msgs, which are fresh: sorted and at once outside CDN mode, else through
// the heap. Caller holds d.mu.
func (d *delivery) outLocked(msgs []*clientpb.Message) {
	if d.delay == 0 && len(d.held) == 0 {
		slices.SortStableFunc(msgs, compareMessages)
		for _, m := range msgs {
			d.emitLocked(m)
		}
		return
	}
	for _, m := range msgs {
		heap.Push(&d.held, m)
	}
	d.playLocked(time.Now())
	notify(d.playWake)
}

// emitLocked queues m for OnMessage, counting it late when it sorts before a message already
// handed on. Caller holds d.mu.
func (d *delivery) emitLocked(m *clientpb.Message) {
	if compareMessages(m, d.played) < 0 {
		d.late++
	} else {
		d.played = m
	}
	d.enqueueLocked(item{msg: m})
}

// playLocked hands on the held messages whose play time has come (within playQuantum of now)
// and returns how long until the next one's, or -1 when none is held. Caller holds d.mu.
func (d *delivery) playLocked(now time.Time) time.Duration {
	horizon := now.Add(playQuantum)
	for len(d.held) > 0 {
		at := d.playTime(d.held[0])
		if at.After(horizon) {
			return at.Sub(now)
		}
		d.emitLocked(heap.Pop(&d.held).(*clientpb.Message))
	}
	return -1
}

// playTime is when m is handed on, on our clock. Caller holds d.mu.
func (d *delivery) playTime(m *clientpb.Message) time.Time {
	return time.UnixMilli(m.GetServerTimeMs()).Add(d.delay - d.offset)
}

// setPlayout sets the play delay (0 ends CDN mode: what is held is handed on at once, in order)
// and the server's clock offset.
func (d *delivery) setPlayout(delay, offset time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.delay, d.offset = delay, offset
	if delay == 0 {
		for len(d.held) > 0 {
			d.emitLocked(heap.Pop(&d.held).(*clientpb.Message))
		}
	}
	notify(d.playWake)
}

// segment takes the messages of a segment: duplicates are dropped, the rest wait for their play
// time. Unlike pushed messages they do not move where a reconnect recovers from: the long
// connection's own messages of that time may still be missing after an outage. It returns
// how many were new.
func (d *delivery) segment(msgs []*clientpb.Message) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0
	}
	fresh := d.freshLocked(msgs)
	d.fromSegments += uint64(len(fresh))
	d.outLocked(fresh)
	return len(fresh)
}

// play hands on held messages as their play times come, until ctx ends.
func (d *delivery) play(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		wait := d.playLocked(time.Now())
		d.mu.Unlock()
		if wait < 0 {
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.playWake:
		case <-timer.C:
		}
	}
}

// playStats returns the delivery's counts for CDNStats.
func (d *delivery) playStats() (late, duplicates, fromSegments uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.late, d.duplicates, d.fromSegments
}
