package chatlink

import (
	"context"
	"sync"
	"time"

	"roomcast/proto/clientpb"
)

// historyReads shares a node's reads of a room's history among the logins that ask for it at
// the same time. A dead node's members come back together: 2,000 members of one room that each
// read the room's history from JetStream make 2,000 reads of the same records, which load the
// NATS servers and slow every login behind them (their joins go over the same servers).
//
// A login's read must start after the login joined the room's fan-out, so that a message is
// either in what it reads or in its live delivery (the client drops what it gets twice). So a
// login never takes the result of a read that is already under way: it waits for the room's
// next read, which starts as soon as the one under way ends. A room has at most one read under
// way and one waiting, however many logins ask.
type historyReads struct {
	fetch  func(historyKey) (roomHistory, error) // one read
	spawn  func(func())                          // runs a read on a goroutine of its own
	served func(askers int)                      // a read ended; askers took its result

	mu    sync.Mutex
	rooms map[historyKey]*historyRooms
}

// historyKey is what a read reads: a room, within its retention.
type historyKey struct {
	app, room string
	keep      int           // the newest keep messages (0: all)
	age       time.Duration // none older (0: any age)
}

// roomHistory is a room's kept messages, oldest first, with the ids of those recalled among
// them: they are never sent, but their numbers are not missing (selectHistory).
type roomHistory struct {
	msgs     []*clientpb.Message
	recalled map[string]bool
}

// historyRooms is a room's read under way and the one its newer askers wait for.
type historyRooms struct {
	running, next *historyRead
}

// historyRead is one read of a room's history; its result is set before done is closed.
type historyRead struct {
	done   chan struct{}
	kept   roomHistory // shared by every asker: read only
	err    error
	askers int
}

// read returns the messages kept for k's room, from a read that started after the call, or
// ctx's error if it ends first.
func (h *historyReads) read(ctx context.Context, k historyKey) (roomHistory, error) {
	h.mu.Lock()
	if h.rooms == nil {
		h.rooms = make(map[historyKey]*historyRooms)
	}
	rs := h.rooms[k]
	if rs == nil {
		rs = &historyRooms{}
		h.rooms[k] = rs
	}
	r := rs.next
	if r == nil {
		r = &historyRead{done: make(chan struct{})}
		if rs.running == nil {
			rs.running = r
			h.start(k, rs, r)
		} else {
			rs.next = r // starts when the running read ends
		}
	}
	r.askers++
	h.mu.Unlock()

	select {
	case <-r.done:
		return r.kept, r.err
	case <-ctx.Done():
		return roomHistory{}, ctx.Err()
	}
}

// start runs r, then the room's next read if logins asked for one meanwhile. h.mu is held.
func (h *historyReads) start(k historyKey, rs *historyRooms, r *historyRead) {
	h.spawn(func() {
		kept, err := h.fetch(k)
		h.mu.Lock()
		defer h.mu.Unlock()
		r.kept, r.err = kept, err
		close(r.done)
		h.served(r.askers)
		rs.running, rs.next = rs.next, nil
		if rs.running != nil {
			h.start(k, rs, rs.running)
		} else {
			delete(h.rooms, k)
		}
	})
}
