package sdk

import (
	"cmp"
	"strings"
	"sync"
	"time"

	"roomcast/proto/clientpb"
)

// item is one thing for the callback goroutine: a message or an event.
type item struct {
	msg *clientpb.Message
	ev  Event
	ack string // the id of an at-least-once message handed on before, whose copy came (inbox.go)
}

// idFloor returns the least message id of millisecond ms: it sorts before every id made then or
// later. An id is 26 characters of Crockford base32, the first 10 the milliseconds
// (docs/protocol.md).
func idFloor(ms int64) string {
	const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	b := []byte(strings.Repeat("0", 26))
	for i := 9; i >= 0; i-- {
		b[i] = crockford[ms&31]
		ms >>= 5
	}
	return string(b)
}

// compareMessages orders messages by server time, then id (ids sort by time and are unique).
func compareMessages(a, b *clientpb.Message) int {
	if c := cmp.Compare(a.GetServerTimeMs(), b.GetServerTimeMs()); c != 0 {
		return c
	}
	return cmp.Compare(a.GetId(), b.GetId())
}

// delivery hands the app every message once and in order, with the events in between, through
// a queue the callback goroutine empties.
//
// A connection's live messages arrive in order; what may come out of order is history (recovery
// after a reconnect, history at login), which the ChatLink sends after the LoginAck, possibly
// after live messages. So from a login that asked for history until its answer (or
// Config.RecoveryWait), messages are held, then handed on sorted by (server time, id). Ids seen
// are remembered (Config.DedupeWindow of them) to drop duplicates. Only the latest connection
// that logged in is listened to: during a move, the old one's last pushes come again on the new
// one or through its recovery. In CDN mode the messages of both paths then wait for their play
// time (playout.go).
type delivery struct {
	window int           // ids remembered
	limit  int           // messages queued at most before the consumer counts as slow
	wait   time.Duration // how long a hold lasts without an answer

	mu  sync.Mutex // guards the fields below
	gen uint64     // the connection listened to
	// The room's counters as last handed to the app (counters.go), and their version.
	counterMap     map[string]int64
	counterVersion uint64
	viewers        ViewerCountEvent  // the room's viewer count as last received (viewers.go)
	attrs          map[string]string // the room's attributes as last handed over (attributes.go)
	attrsVersion   uint64
	seen           map[string]struct{}
	order          []string // the ids in seen, as a ring: order[next] is forgotten first
	next           int
	lastID         string // the greatest id seen: where a reconnect recovers from
	lastSeq        uint64 // the greatest room_seq seen
	baseline       string // the id floor of the first login's time: recovery's start before any message
	hold           *hold  // set while a history answer is awaited
	queue          []item
	queued         int // messages in queue
	closed         bool
	wake           chan struct{} // one value: the queue changed
	inbox          inboxSeen     // at-least-once messages taken (inbox.go)

	playout // CDN mode: messages wait for their play time (playout.go)
}

// hold is a login's wait for its history answer.
type hold struct {
	gen   uint64
	since string
	msgs  []*clientpb.Message // held: live ones and the history
	count int                 // new messages the history brought
	timer *time.Timer
}

func newDelivery(cfg *Config) *delivery {
	return &delivery{
		window: cfg.DedupeWindow,
		limit:  cfg.MessageBuffer,
		wait:   cfg.RecoveryWait,
		seen:   make(map[string]struct{}),
		wake:   make(chan struct{}, 1),

		playout: playout{playWake: make(chan struct{}, 1)},
	}
}

// loggedIn makes connection gen the one listened to, queues ev, and starts holding messages
// when its login asked for history (since, or a count).
func (d *delivery) loggedIn(gen uint64, ev *ConnectedEvent, login *clientpb.Login) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen = gen
	if d.baseline == "" {
		d.baseline = idFloor(ev.LoginAck.GetServerTimeMs())
	}
	d.enqueueLocked(item{ev: ev})
	if h := d.hold; h != nil { // the previous connection's answer never came
		d.releaseLocked(&RecoveredEvent{Since: h.since, Err: ErrHistoryUnavailable})
	}
	if login.GetRecoverSince() == "" && login.GetHistory() == 0 {
		return
	}
	h := &hold{gen: gen, since: login.GetRecoverSince()}
	h.timer = time.AfterFunc(d.wait, func() { d.timeout(h) })
	d.hold = h
}

// push takes a Push of connection gen. It reports false when the queue is over its limit: the
// consumer is too slow, and the connection should end rather than grow the queue.
func (d *delivery) push(gen uint64, p *clientpb.Push) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen || d.closed {
		return true
	}
	if t := p.GetThinned(); t != nil {
		d.enqueueLocked(item{ev: &ThinnedEvent{Normal: t.GetNormal(), Bulk: t.GetBulk()}})
	}
	fresh := d.freshLocked(d.takeInboxLocked(p.GetMessages()))
	for _, m := range fresh {
		d.lastID = max(d.lastID, m.GetId())
		d.lastSeq = max(d.lastSeq, m.GetRoomSeq())
	}
	if h := d.hold; h != nil && h.gen == gen {
		h.msgs = append(h.msgs, fresh...)
		if p.GetHistory() {
			h.count += len(fresh)
		}
		if rec := p.GetRecovery(); rec != nil {
			d.releaseLocked(&RecoveredEvent{Since: h.since, Recovered: rec.GetRecovered(), Missing: rec.GetMissing()})
		}
		return d.queued <= d.limit
	}
	d.outLocked(fresh)
	return d.queued <= d.limit
}

// historyFailed ends connection gen's hold: the server answered its history request with err.
func (d *delivery) historyFailed(gen uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.hold; h != nil && h.gen == gen {
		d.releaseLocked(&RecoveredEvent{Since: h.since, Err: err})
	}
}

func (d *delivery) timeout(h *hold) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hold == h && !d.closed {
		d.releaseLocked(&RecoveredEvent{Since: h.since, Err: ErrHistoryUnavailable})
	}
}

// releaseLocked hands on the held messages, sorted, then ev. Caller holds d.mu.
func (d *delivery) releaseLocked(ev *RecoveredEvent) {
	h := d.hold
	d.hold = nil
	h.timer.Stop()
	d.outLocked(h.msgs)
	ev.Count = h.count
	d.enqueueLocked(item{ev: ev})
}

// freshLocked returns the messages of msgs not seen before, remembers them and counts the
// others as duplicates. Caller holds d.mu.
func (d *delivery) freshLocked(msgs []*clientpb.Message) []*clientpb.Message {
	var fresh []*clientpb.Message
	for _, m := range msgs {
		if d.rememberLocked(m.GetId()) {
			fresh = append(fresh, m)
		} else {
			d.duplicates++
		}
	}
	return fresh
}

// remember marks the id of a message this client sent as seen, without delivering it: there is
// no echo, but a recovery would bring it back. It does not move where recovery starts: messages
// of others stamped before it may still be on their way.
func (d *delivery) remember(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rememberLocked(id)
}

// rememberLocked adds id to the ids seen and reports whether it is new. Without a window (or an
// id) every message is new. Caller holds d.mu.
func (d *delivery) rememberLocked(id string) bool {
	if d.window <= 0 || id == "" {
		return true
	}
	if _, ok := d.seen[id]; ok {
		return false
	}
	if len(d.order) < d.window {
		d.order = append(d.order, id)
	} else {
		delete(d.seen, d.order[d.next])
		d.order[d.next] = id
		d.next = (d.next + 1) % d.window
	}
	d.seen[id] = struct{}{}
	return true
}

// recoverFrom returns where a reconnect recovers from: the greatest id seen (or, before any,
// the first login's time: the ids of the ChatLink's and the room service's clocks need not
// agree, so once a message was seen its id counts) and the greatest room_seq seen.
func (d *delivery) recoverFrom() (since string, seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lastID == "" {
		return d.baseline, d.lastSeq
	}
	return d.lastID, d.lastSeq
}

// lastSeen returns the greatest id seen, or "" before any.
func (d *delivery) lastSeen() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastID
}

// event queues ev.
func (d *delivery) event(ev Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.enqueueLocked(item{ev: ev})
}

func (d *delivery) enqueueLocked(it item) {
	if d.closed {
		return
	}
	d.queue = append(d.queue, it)
	if it.msg != nil {
		d.queued++
	}
	notify(d.wake)
}

// close queues ev as the last item; take returns what is left and then reports the end.
func (d *delivery) close(ev Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.enqueueLocked(item{ev: ev})
	d.closed = true
	if d.hold != nil {
		d.hold.timer.Stop()
		d.hold = nil
	}
}

// notify wakes the goroutine that waits on ch, a channel of one value, without blocking: a
// wake-up already pending covers this one.
func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// take waits for queued items and returns them all; ok is false once the queue is closed and
// empty.
func (d *delivery) take() (items []item, ok bool) {
	for {
		d.mu.Lock()
		items, closed := d.queue, d.closed
		d.queue, d.queued = nil, 0
		d.mu.Unlock()
		if len(items) > 0 || closed {
			return items, len(items) > 0 || !closed
		}
		<-d.wake
	}
}
