package chatlink

import (
	"context"
	"slices"
	"time"

	"roomcast/internal/buspb"
	"roomcast/store/historystore"
)

// A room's critical and normal messages are numbered (room_seq) by the room service instance
// that sends them, one window at a time (room/batcher.go). With several instances, two windows
// numbered one after the other can reach two nodes in different orders, and a node that lost
// its NATS connection for a moment misses the windows published meanwhile. So a node delivers
// a room's numbered messages in room_seq order: a batch that arrives ahead of a missing number
// is held back (its unnumbered messages, the bulk lane, are not) until the missing one arrives;
// after Config.OrderHold the node reads the missing numbers from the room's history, and
// when that read ends (Config.OrderFillTimeout at most) it gives up on what is still missing, counts it and logs it, and
// delivers what it holds. The numbers a batch took are its first_room_seq..last_room_seq, so
// numbers that went elsewhere (to a CDN pusher) are not missing.
//
// In order, admitting a batch is a comparison per message under the room's fan-out lock, which
// receive holds anyway; the hold, the history read and the bookkeeping of what was filled are
// only for gaps.

const (
	defaultOrderHold = 100 * time.Millisecond // Config.OrderHold
	// defaultOrderFillTimeout is Config.OrderFillTimeout: a read of the home region's history
	// from a region 150 ms away takes a 300 ms round trip and more.
	defaultOrderFillTimeout = time.Second
	// maxHeldMessages bounds what a room holds behind a gap: past it the node reads the
	// history at once instead of waiting out OrderHold.
	maxHeldMessages = 4096
	// orderRestartSpan: a batch numbered this far below what the node expects means the room's
	// counter started again (the room's history was deleted); the node takes the new numbers.
	orderRestartSpan = 1 << 16
	// fillLookback is how far back in time the history read for a gap goes: the missing
	// messages were published moments before the held ones.
	fillLookback = 30 * time.Second
	// filledRanges is how many filled gaps a room remembers, to drop the live copies of
	// messages it took from the history should they still arrive.
	filledRanges = 8
)

// Order events, as roomcast_chatlink_order_total names them.
const (
	orderHeld      = iota // a batch held back behind a missing number
	orderFilled           // a missing message taken from the room's history
	orderSkipped          // a missing number given up: in neither the bus nor the history in time
	orderLate             // a numbered message delivered after a later number (it came after its number was given up)
	orderDuplicate        // a live message dropped because the history already gave it
	orderEvents
)

var orderEventNames = [orderEvents]string{"held", "filled", "skipped", "late", "duplicate"}

// roomOrder is a room's delivery order on this node. Guarded by roomFanout.mu.
type roomOrder struct {
	next    uint64      // the room_seq to deliver next; 0 until the room's first numbered batch
	held    []heldBatch // batches ahead of next, by first number
	nheld   int         // messages in held
	timer   *time.Timer // fires OrderHold after the oldest held batch arrived
	filling bool        // a history read for the gap is on its way
	filled  []seqRange  // the last filledRanges gaps filled from the history
}

type heldBatch struct {
	first, last uint64
	msgs        []queued
	at          time.Time
}

type seqRange struct{ lo, hi uint64 }

// batchRange returns the numbers a batch took: its first_room_seq..last_room_seq, or (from a
// room service that does not set them) its numbered messages' lowest and highest. 0, 0: none.
func batchRange(b *buspb.RoomBatch) (first, last uint64) {
	if b.LastRoomSeq > 0 {
		return b.FirstRoomSeq, b.LastRoomSeq
	}
	for _, m := range b.Messages {
		if s := m.RoomSeq; s > 0 {
			if first == 0 || s < first {
				first = s
			}
			last = max(last, s)
		}
	}
	return first, last
}

// admitLocked puts a batch's messages in f.pending in room_seq order, or holds them back behind a
// missing number; arrived is when the batch reached the node (queued.arrived). Caller holds f.mu.
func (f *roomFanout) admitLocked(batch *buspb.RoomBatch, arrived int64) {
	n := f.r.t.n
	first, last := batchRange(batch)
	o := &f.order
	if last == 0 || n.cfg.OrderHold < 0 {
		f.pendLocked(batch, 0, arrived)
		return
	}
	if o.next > 0 && last+orderRestartSpan < o.next {
		n.log.Warn("room numbers started again; delivering from the new numbers", "subject", f.r.subject, "expected", o.next, "got", first)
		f.releaseAllLocked()
		o.next = 0
	}
	if o.next == 0 || first <= o.next {
		f.pendLocked(batch, o.next, arrived)
		if last >= o.next {
			o.next = last + 1
			if len(o.held) > 0 {
				f.releaseLocked()
			}
		}
		return
	}
	// Ahead of a gap: the unnumbered messages go now, the numbered ones wait.
	h := heldBatch{first: first, last: last, at: time.Now()}
	for i, m := range batch.Messages {
		q := queued{m: m, sender: sender(batch, i), arrived: arrived}
		if m.RoomSeq == 0 {
			f.pending = append(f.pending, q)
		} else {
			h.msgs = append(h.msgs, q)
		}
	}
	i, _ := slices.BinarySearchFunc(o.held, first, func(h heldBatch, s uint64) int { return cmpU64(h.first, s) })
	o.held = slices.Insert(o.held, i, h)
	o.nheld += len(h.msgs)
	n.m.order[orderHeld].Inc()
	switch {
	case o.nheld > maxHeldMessages && !o.filling:
		if o.timer != nil {
			o.timer.Stop()
		}
		f.startFillLocked()
	case len(o.held) == 1:
		f.armOrderLocked()
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func sender(b *buspb.RoomBatch, i int) string {
	if i < len(b.SenderSessions) {
		return b.SenderSessions[i]
	}
	return ""
}

// pendLocked appends a batch's messages to f.pending. Numbered messages below next came after
// their number was given up or filled from the history: the filled ones are dropped, the
// others delivered late (both counted). Caller holds f.mu.
func (f *roomFanout) pendLocked(batch *buspb.RoomBatch, next uint64, arrived int64) {
	for i, m := range batch.Messages {
		if s := m.RoomSeq; s > 0 && s < next {
			if f.order.wasFilled(s) {
				f.r.t.n.m.order[orderDuplicate].Inc()
				continue
			}
			f.r.t.n.m.order[orderLate].Inc()
		}
		f.pending = append(f.pending, queued{m: m, sender: sender(batch, i), arrived: arrived})
	}
}

func (o *roomOrder) wasFilled(s uint64) bool {
	for _, r := range o.filled {
		if r.lo <= s && s <= r.hi {
			return true
		}
	}
	return false
}

// releaseLocked moves the held batches that next has reached to f.pending, and times the gap
// before the next one, if any. Caller holds f.mu.
func (f *roomFanout) releaseLocked() {
	o := &f.order
	k := 0
	for ; k < len(o.held) && o.held[k].first <= o.next; k++ {
		h := &o.held[k]
		f.pending = append(f.pending, h.msgs...)
		o.nheld -= len(h.msgs)
		o.next = max(o.next, h.last+1)
	}
	clear(o.held[:k])
	o.held = o.held[k:]
	if len(o.held) == 0 {
		o.held = nil
		if o.timer != nil {
			o.timer.Stop()
		}
		return
	}
	if k > 0 && !o.filling {
		f.armOrderLocked()
	}
}

// releaseAllLocked delivers everything held, giving up (and counting) the missing numbers
// before each held batch. Caller holds f.mu.
func (f *roomFanout) releaseAllLocked() {
	o := &f.order
	for len(o.held) > 0 {
		f.skipLocked(o.held[0].first, nil)
		f.releaseLocked()
	}
}

// skipLocked gives up the numbers from next to before, counting and logging them; err is
// why, if the history could not be read. Caller holds f.mu.
func (f *roomFanout) skipLocked(before uint64, err error) {
	o := &f.order
	if before <= o.next {
		return
	}
	n := f.r.t.n
	missing := before - o.next
	n.m.order[orderSkipped].Add(float64(missing))
	attrs := []any{"subject", f.r.subject, "from", o.next, "to", before - 1, "numbers", missing}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	n.log.Warn("room messages missing: delivering the later ones without them", attrs...)
	o.next = before
}

// armOrderLocked times the oldest held batch's OrderHold. Caller holds f.mu.
func (f *roomFanout) armOrderLocked() {
	o := &f.order
	d := time.Until(o.held[0].at.Add(f.r.t.n.cfg.OrderHold))
	if o.timer == nil {
		o.timer = time.AfterFunc(d, f.r.orderTimeout)
	} else {
		o.timer.Reset(d)
	}
}

// orderTimeout runs when a held batch has waited OrderHold for a missing number.
func (r *localRoom) orderTimeout() {
	f := &r.fanout
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped || len(f.order.held) == 0 || f.order.filling {
		return
	}
	f.startFillLocked()
}

// startFillLocked reads the numbers missing before the oldest held batch from the room's
// history, within OrderFillTimeout, in a goroutine of the node's. Caller holds f.mu.
func (f *roomFanout) startFillLocked() {
	o := &f.order
	o.filling = true
	r, n := f.r, f.r.t.n
	before := o.held[0].first
	n.goAsync(func() {
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.OrderFillTimeout)
		kept, _, err := historystore.Read(ctx, n.js, r.app, r.room, historystore.Range{Since: n.now().Add(-fillLookback)})
		cancel()
		f.mu.Lock()
		o.filling = false
		if f.stopped {
			f.mu.Unlock()
			return
		}
		f.fillLocked(before, kept, err)
		r.deliverAndUnlock()
	})
}

// fillLocked puts the kept messages that fill the gap before the held batch numbered from
// before in f.pending, gives up the rest of that gap, and releases what that frees. If that gap
// closed live meanwhile and another is open, the other gets its own OrderHold. Caller holds
// f.mu.
func (f *roomFanout) fillLocked(before uint64, kept []historystore.KeptMessage, err error) {
	o := &f.order
	if len(o.held) == 0 {
		return
	}
	if o.held[0].first != before {
		f.armOrderLocked()
		return
	}
	var fill []historystore.KeptMessage
	for _, k := range kept {
		if s := k.Msg.RoomSeq; s >= o.next && s < before {
			fill = append(fill, k)
		}
	}
	// The history is in the order the windows were kept, which two instances may interleave.
	slices.SortFunc(fill, func(a, b historystore.KeptMessage) int { return cmpU64(a.Msg.RoomSeq, b.Msg.RoomSeq) })
	for _, k := range fill {
		s := k.Msg.RoomSeq
		if s < o.next {
			continue // kept twice
		}
		f.skipLocked(s, err)
		// Its sender, when the record names one, is left out as it is live (write).
		f.pending = append(f.pending, queued{m: k.Msg, sender: k.Sender, arrived: f.r.t.n.now().UnixNano()})
		f.r.t.n.m.order[orderFilled].Inc()
		o.rememberFilled(s)
		o.next = s + 1
	}
	f.skipLocked(before, err)
	f.releaseLocked()
}

// rememberFilled notes that number s was delivered from the history.
func (o *roomOrder) rememberFilled(s uint64) {
	if k := len(o.filled); k > 0 && o.filled[k-1].hi+1 == s {
		o.filled[k-1].hi = s
		return
	}
	if len(o.filled) == filledRanges {
		o.filled = slices.Delete(o.filled, 0, 1)
	}
	o.filled = append(o.filled, seqRange{s, s})
}
