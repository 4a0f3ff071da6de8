package chatlink

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
	"roomcast/store/counterstore"
)

// A room's counters (likes, gifts; docs/protocol.md, "Counters"): a member's CounterAdd is
// checked here (name, amount, the connection's rate, the room's number of counters) and added to
// the room's sums on this node; every window (Config.CounterWindow) the node sends each room's
// sums to the room service as one CounterWindow, and nothing for a room without adds. The room
// service writes them to the store and broadcasts the totals on the room's subject; the node
// passes them to its members at most every countersEvery, one CounterTotals frame encoded once.
//
// A room's windows go one at a time, numbered per boot (growing numbers, across rooms), and a window is sent again, with its
// number, until the room service answers it: the service applies a number once, so a lost
// answer counts nothing twice. What a node that dies had summed and not yet had answered (at
// most a window and the one on its way) is lost: adds are counted at most once from it.

// DefaultCounterWindow is how long a node sums a room's counter adds before it sends them.
const DefaultCounterWindow = 200 * time.Millisecond

// DefaultCounterMaxAmount is the largest amount one CounterAdd may add.
const DefaultCounterMaxAmount = 100

// countersEvery is how often at most a node writes a room's counter totals to its members.
const countersEvery = 250 * time.Millisecond

const limitCounterConn = "counter_conn"

// counterSums are the node's rooms' adds not yet answered by the room service.
type counterSums struct {
	n       *Node
	windows *prometheus.CounterVec // windows sent, by result
	adds    *prometheus.CounterVec // adds, by result
	counted prometheus.Counter     // adds's child "counted", resolved once: one a tap

	mu    sync.Mutex // guards rooms and seq
	rooms map[roomKey]*roomSums
	// seq numbers the windows of every room, so that a room forgotten between its adds (none
	// pending nor on their way) still gets greater numbers than it had: the room service
	// applies a node's window only when its number is greater than the last it applied.
	seq uint64
}

type roomSums struct {
	pending  map[string]int64     // adds since the last window was taken
	inflight *buspb.CounterWindow // sent, not answered yet; nil: none
}

func newCounterSums(n *Node) *counterSums {
	s := &counterSums{
		n: n, rooms: make(map[roomKey]*roomSums),
		windows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_counter_windows_total",
			Help: "Counter windows (a room's summed counter adds) sent to the room service, by result: ok, retry (unanswered or refused for now: sent again with its number), lost (the node stopped before an answer).",
		}, []string{"result"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_counter_adds_total",
			Help: "Members' CounterAdd frames, by result: counted, or the refusal's ERROR_CODE_* (bad request, over the rate, too many counters).",
		}, []string{"result"}),
	}
	s.counted = s.adds.WithLabelValues("counted")
	return s
}

// counterAdd checks a member's add and counts it, or tells the member why not.
func (c *conn) counterAdd(a *clientpb.CounterAdd) {
	n := c.node
	amount := max(a.Amount, 1)
	refuse := func(code clientpb.ErrorCode, msg string, retry time.Duration) {
		n.counters.adds.WithLabelValues(code.String()).Inc()
		e := &clientpb.Error{Code: uint32(code), Message: msg, Seq: a.Seq}
		if retry > 0 {
			e.RetryAfterMs = ratelimit.Millis(retry)
		}
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: e}})
	}
	switch {
	case !counterstore.ValidName(a.Name):
		refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "counter name must be 1 to 32 characters of A-Z a-z 0-9 _ - : .", 0)
		return
	case amount > uint32(n.cfg.CounterMaxAmount):
		refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, fmt.Sprintf("amount over %d", n.cfg.CounterMaxAmount), 0)
		return
	}
	now := n.now()
	ok, retry := c.takeRate(func(s *connSends) *ratelimit.Bucket { return &s.counterRate }, n.cfg.Limits.CounterAddsPerConn, now)
	if !ok {
		n.limitHit(limitCounterConn, c, now)
		refuse(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED, "over the "+limitCounterConn+" rate", retry)
		return
	}
	var known *clientpb.CounterTotals
	if r := n.rooms.lookup(c.app, c.room); r != nil {
		known = r.counters.Load()
	}
	if !n.counters.add(roomKey{c.app, c.room}, a.Name, int64(amount), known) {
		refuse(clientpb.ErrorCode_ERROR_CODE_TOO_MANY_COUNTERS, fmt.Sprintf("the room has %d counters", counterstore.MaxPerRoom), 0)
		return
	}
	n.counters.counted.Inc()
}

// add adds amount to the room's counter name; false when name would be one counter more than the
// room may have, by what the node knows (known: the room's totals as last broadcast).
func (s *counterSums) add(k roomKey, name string, amount int64, known *clientpb.CounterTotals) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.rooms[k]
	if rs == nil {
		rs = &roomSums{}
		s.rooms[k] = rs
	}
	if _, ok := rs.pending[name]; !ok && !rs.knows(name, known) && rs.names(known) >= counterstore.MaxPerRoom {
		return false
	}
	if rs.pending == nil {
		rs.pending = make(map[string]int64)
	}
	rs.pending[name] += amount
	return true
}

func (rs *roomSums) knows(name string, known *clientpb.CounterTotals) bool {
	has := func(cs []*clientpb.Counter) bool {
		return slices.ContainsFunc(cs, func(c *clientpb.Counter) bool { return c.Name == name })
	}
	return has(known.GetCounters()) || has(rs.inflight.GetAdds())
}

// names counts the room's counters the node knows of: broadcast, on their way, pending.
func (rs *roomSums) names(known *clientpb.CounterTotals) int {
	seen := make(map[string]bool)
	for _, c := range known.GetCounters() {
		seen[c.Name] = true
	}
	for _, c := range rs.inflight.GetAdds() {
		seen[c.Name] = true
	}
	for name := range rs.pending {
		seen[name] = true
	}
	return len(seen)
}

// loop sends the rooms' windows every Config.CounterWindow until the node stops.
func (s *counterSums) loop() {
	t := time.NewTicker(s.n.cfg.CounterWindow)
	defer t.Stop()
	for {
		select {
		case <-s.n.ctx.Done():
			return
		case <-t.C:
			s.tick()
		}
	}
}

// tick takes the window of every room that has adds and no window on its way, and sends it.
func (s *counterSums) tick() {
	var out []*buspb.CounterWindow
	s.mu.Lock()
	for k, rs := range s.rooms {
		switch {
		case rs.inflight != nil:
			continue
		case len(rs.pending) == 0:
			delete(s.rooms, k)
			continue
		}
		s.seq++
		w := &buspb.CounterWindow{App: k.app, Room: k.room, Node: s.n.cfg.Node, Boot: s.n.stream.boot, Seq: s.seq,
			Adds: make([]*clientpb.Counter, 0, len(rs.pending))}
		for name, sum := range rs.pending {
			w.Adds = append(w.Adds, &clientpb.Counter{Name: name, Total: sum})
		}
		rs.pending, rs.inflight = nil, w
		out = append(out, w)
	}
	s.mu.Unlock()
	for _, w := range out {
		s.n.goAsync(func() { s.deliver(w) })
	}
}

// deliver sends w until the room service answers it, a window apart, or the node stops.
func (s *counterSums) deliver(w *buspb.CounterWindow) {
	n := s.n
	for {
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
		var rep buspb.Reply
		err := n.request(ctx, busCounters, bus.SubjectRoomCounters, w, &rep)
		cancel()
		if err == nil && rep.Code == 0 {
			s.windows.WithLabelValues("ok").Inc()
			// The totals the window went into, before the window is forgotten: the room's
			// counters stay known to add (the count of names) without waiting for the
			// broadcast, which may come after this answer.
			if r := n.rooms.lookup(w.App, w.Room); r != nil && rep.Counters != nil {
				r.setCounters(rep.Counters)
			}
			s.mu.Lock()
			if rs := s.rooms[roomKey{w.App, w.Room}]; rs != nil && rs.inflight == w {
				rs.inflight = nil
			}
			s.mu.Unlock()
			return
		}
		s.windows.WithLabelValues("retry").Inc()
		n.log.Warn("counter window not taken: sending it again", "app", w.App, "room", w.Room, "seq", w.Seq, "err", err, "code", rep.Code)
		select {
		case <-n.ctx.Done():
			s.windows.WithLabelValues("lost").Inc()
			n.log.Warn("counter window lost: the node stopped", "app", w.App, "room", w.Room, "seq", w.Seq)
			return
		case <-time.After(n.cfg.CounterWindow):
		}
	}
}

// drain sends what the rooms have summed and waits for the answers, for a node that stops;
// ctx bounds the wait.
func (s *counterSums) drain(ctx context.Context) error {
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		s.tick()
		s.mu.Lock()
		left := len(s.rooms)
		s.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chatlink: counter windows of %d rooms not answered at the deadline: %w", left, ctx.Err())
		case <-poll.C:
		}
	}
}

// roomCounters is what a node keeps of its room's counters: the newest totals the room service
// broadcast, and when it last wrote them to the members.
type roomCounters struct {
	mu        sync.Mutex // guards the fields below
	lastWrite time.Time
	scheduled bool
	timer     *time.Timer // the write due, while scheduled
	stopped   bool        // the room left the node: no more writes
}

// setCounters takes the room's totals (from a broadcast or a join's answer): newer ones than the
// room has are written to its members, at most every countersEvery.
func (r *localRoom) setCounters(t *clientpb.CounterTotals) {
	for {
		cur := r.counters.Load()
		if cur != nil && cur.Version >= t.Version {
			return
		}
		if r.counters.CompareAndSwap(cur, t) {
			break
		}
	}
	rc := &r.countersOut
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.scheduled || rc.stopped {
		return // the write due takes the newest
	}
	rc.scheduled = true
	rc.timer = time.AfterFunc(max(0, time.Until(rc.lastWrite.Add(countersEvery))), r.writeCounters)
}

// stopCounters stops the room's writes of its counters: its last member left the node.
func (r *localRoom) stopCounters() {
	rc := &r.countersOut
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.stopped = true
	if rc.timer != nil {
		rc.timer.Stop()
	}
}

// writeCounters writes the room's newest totals to every member that has had its LoginAck.
func (r *localRoom) writeCounters() {
	rc := &r.countersOut
	rc.mu.Lock()
	if rc.stopped {
		rc.mu.Unlock()
		return
	}
	rc.scheduled, rc.lastWrite = false, time.Now()
	rc.mu.Unlock()
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_CounterTotals{CounterTotals: r.counters.Load()}}, false, "counter totals")
}
