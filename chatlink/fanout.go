package chatlink

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/tag"
)

// queued is a message waiting for its room's next flush, with the session that sent it. skip
// names the audiences (tag sets) the budgets left the message out for (budget.go); nil for
// none. In the log, an entry without a message is a marker: thinned counts the messages the
// budgets and flow control left out there, which the members learn of in their next Push
// (Push.thinned). arrived is when it reached the node (Config.Now, Unix nanoseconds), which the
// room's latency budget counts from.
type queued struct {
	m       *clientpb.Message
	sender  string
	skip    map[*tag.Set]struct{}
	thinned *thinnedCounts
	arrived int64
}

// thinnedCounts counts normal and bulk messages left out: for every member, and for the
// members of some audiences only.
type thinnedCounts struct {
	all        *clientpb.Thinned // nil for none
	byAudience map[*tag.Set]*clientpb.Thinned
}

// thinnedMarker returns the log entry for the normal and bulk messages of dropped (by lane, for
// every member) and droppedFor (by audience), or false when there were none.
func thinnedMarker(dropped [4]int, droppedFor map[*tag.Set][4]int) (queued, bool) {
	th := &thinnedCounts{all: addThinned(nil, dropped[clientpb.Lane_LANE_NORMAL], dropped[clientpb.Lane_LANE_BULK])}
	for set, d := range droppedFor {
		th.add(set, d[clientpb.Lane_LANE_NORMAL], d[clientpb.Lane_LANE_BULK])
	}
	if th.all == nil && th.byAudience == nil {
		return queued{}, false
	}
	return queued{thinned: th}, true
}

// add counts normal and bulk messages left out for the audience set.
func (th *thinnedCounts) add(set *tag.Set, normal, bulk int) {
	if normal == 0 && bulk == 0 {
		return
	}
	if th.byAudience == nil {
		th.byAudience = make(map[*tag.Set]*clientpb.Thinned)
	}
	th.byAudience[set] = addThinned(th.byAudience[set], normal, bulk)
}

// splitThinned returns the messages of a write without its markers, and what the markers
// counted. Without markers msgs itself is returned.
func splitThinned(msgs []queued) ([]queued, thinnedCounts) {
	var th thinnedCounts
	var kept []queued
	marked := false
	for i, q := range msgs {
		if q.m != nil {
			if marked {
				kept = append(kept, q)
			}
			continue
		}
		if !marked {
			marked = true
			kept = append(make([]queued, 0, len(msgs)), msgs[:i]...)
		}
		th.all = addThinned(th.all, int(q.thinned.all.GetNormal()), int(q.thinned.all.GetBulk()))
		for set, t := range q.thinned.byAudience {
			th.add(set, int(t.Normal), int(t.Bulk))
		}
	}
	if !marked {
		return msgs, th
	}
	return kept, th
}

// Phases: a big room's members on a node are split into phase groups, each flushed at its own
// offset within the tick, so that a room of 15,000 members writes about 940 sockets every
// 1/16 of the tick rather than 15,000 at once. Every member still gets one frame per tick with
// that tick's messages merged, but the writes are spread over the tick: the latency a member sees
// does not depend on its place in one long burst, and the node's other work (other rooms,
// logins, the server's API in a single process) does not queue behind it. Members are kept in
// phaseSlots slots, filled in turn; with p phases (a power of two), group g is slots g, g+p, ….
const (
	phaseSlots          = 16
	defaultPhaseMembers = 1024                  // Config.PhaseMembers
	minPhaseTick        = 10 * time.Millisecond // no phase timer runs more often than this
)

// phasesFor returns how many phase groups a room of size members flushed every tick should
// use: a power of two, the least that puts at most per members in a group, but no more than
// phaseSlots and no more than keep the phases minPhaseTick apart.
func phasesFor(size, per int, tick time.Duration) int {
	p := 1
	for p < phaseSlots && p*per < size && tick/time.Duration(2*p) >= minPhaseTick {
		p *= 2
	}
	return p
}

// roomFanout merges a room's messages per flush tick and writes each tick's messages to the
// room's members as one frame, encoded once per variant. An idle room has no timer running.
//
// The timer fires every tick/phases. Each time, the messages that arrived since the last time
// pass the budgets and flow control (selectLocked) and join the log, and one phase group, in
// turn, gets what of the log it has not had yet. Log entries every group has had are dropped.
type roomFanout struct {
	r *localRoom

	mu             sync.Mutex // guards the fields below; lock order: roomFanout.mu -> localRoom.mu
	settings       roomSettings
	pending        []queued        // arrived, not yet selected
	log            []queued        // selected, not yet written to every phase group
	logBase        int             // position of log[0] since the room began
	sent           [phaseSlots]int // by phase group: the log position written up to
	phases         int             // phase groups in use (1 for a small room)
	phase          int             // the group the timer writes next
	armed          bool            // the timer will fire
	stopped        bool
	timer          *time.Timer
	tokens         map[*tag.Set]float64 // normal budget left, by audience (budget.go)
	criticalTokens float64
	refilledAt     time.Time
	fcCarry        [4]float64          // flow-control sampling carry, by lane
	dropped        [4]int              // by lane: what the last selectLocked left out for every member
	droppedFor     map[*tag.Set][4]int // by audience and lane: what it left out for some only
	order          roomOrder           // room_seq order (order.go)

	// The room's writes, in the order flush and receive made them. Whoever queues writes
	// while no writer runs becomes the writer (drainWrites) until the queue is empty, so the
	// frames of a room leave in order even when a phase comes before the last one's writes are
	// done, and nobody waits for another's writes to start its own.
	jobs    []writeJob
	writing bool
}

// writeJob is one write of messages to phase group g of p (0 of 1: every member).
type writeJob struct {
	msgs []queued
	g, p int
}

// queueLocked queues writes and reports whether the caller is to write them, with
// drainWrites once it has let go of f.mu. Caller holds f.mu.
func (f *roomFanout) queueLocked(jobs ...writeJob) bool {
	f.jobs = append(f.jobs, jobs...)
	if f.writing {
		return false
	}
	f.writing = true
	return true
}

// drainWrites writes the queued jobs, in order, until the queue is empty.
func (r *localRoom) drainWrites() {
	f := &r.fanout
	for {
		f.mu.Lock()
		jobs := f.jobs
		f.jobs = nil
		if len(jobs) == 0 {
			f.writing = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		for _, j := range jobs {
			r.write(j.msgs, j.g, j.p)
		}
	}
}

func (f *roomFanout) init(r *localRoom, st *roompb.RoomSettings, now time.Time) {
	f.r = r
	f.settings = resolveSettings(st, &r.t.n.cfg)
	f.phases = 1
	f.refilledAt = now
	f.criticalTokens = tokenCap(f.settings.criticalBudget, f.settings.tick)
}

// stop is called when the room has no local members left.
func (f *roomFanout) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	f.pending, f.log, f.jobs = nil, nil, nil
	if f.timer != nil {
		f.timer.Stop()
	}
	if f.order.timer != nil {
		f.order.timer.Stop()
	}
	f.order = roomOrder{}
}

// receive takes a room batch off the bus.
func (r *localRoom) receive(data []byte) {
	n := r.t.n
	var batch buspb.RoomBatch
	if err := proto.Unmarshal(data, &batch); err != nil {
		n.log.Warn("dropping room batch that does not parse", "subject", r.subject)
		return
	}
	if batch.Cdn != nil {
		r.setCdn(batch.Cdn)
	}
	if batch.Counters != nil {
		r.setCounters(batch.Counters) // counters.go
		if len(batch.Messages) == 0 && batch.Settings == nil && batch.LastRoomSeq == 0 {
			return
		}
	}
	if batch.Attributes != nil {
		r.setAttributes(batch.Attributes) // attributes.go
		if len(batch.Messages) == 0 && batch.Settings == nil && batch.LastRoomSeq == 0 {
			return
		}
	}
	if batch.Recall != nil {
		r.recall(batch.Recall) // recall.go
		if len(batch.Messages) == 0 && batch.Settings == nil && batch.LastRoomSeq == 0 {
			return
		}
	}
	if len(batch.MemberChanges) > 0 {
		r.writeMemberNotice(batch.MemberChanges) // viewers.go
		if len(batch.Messages) == 0 && batch.Settings == nil && batch.LastRoomSeq == 0 {
			return
		}
	}
	f := &r.fanout
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	if batch.Settings != nil {
		f.settings = resolveSettings(batch.Settings, &n.cfg)
	}
	f.admitLocked(&batch, n.now().UnixNano()) // order.go
	r.deliverAndUnlock()
}

// deliverAndUnlock starts what f.pending needs: the room's timer, or for an unmerged room its
// writes at once. Caller holds f.mu, which it lets go.
func (r *localRoom) deliverAndUnlock() {
	f, n := &r.fanout, r.t.n
	switch {
	case len(f.pending) == 0:
		f.mu.Unlock()
	case !f.settings.merge:
		// Unmerged: every message at once, as its own frame.
		// Phase groups that have not had all of the merged log (the room was merged a moment
		// ago) get it first.
		jobs := f.catchUpLocked()
		msgs := f.selectLocked(f.pending, time.Now(), n.flow.strength())
		if q, ok := thinnedMarker(f.dropped, f.droppedFor); ok {
			msgs = append(msgs, q)
		}
		f.pending = nil
		for i := range msgs {
			jobs = append(jobs, writeJob{msgs: msgs[i : i+1], p: 1})
		}
		write := f.queueLocked(jobs...)
		f.mu.Unlock()
		if write {
			r.drainWrites()
		}
	case !f.armed:
		f.armLocked()
		f.mu.Unlock()
	default:
		f.mu.Unlock()
	}
}

// catchUpLocked returns the writes that give every phase group what of the log it has not had,
// and empties the log. Caller holds f.mu.
func (f *roomFanout) catchUpLocked() []writeJob {
	var jobs []writeJob
	end := f.logBase + len(f.log)
	for g := range f.phases {
		if f.sent[g] < end {
			jobs = append(jobs, writeJob{f.log[f.sent[g]-f.logBase:], g, f.phases})
		}
		f.sent[g] = end
	}
	f.log, f.logBase = nil, end
	return jobs
}

// armLocked starts the timer for the next phase. Caller holds f.mu.
func (f *roomFanout) armLocked() {
	f.armed = true
	d := f.settings.tick / time.Duration(f.phases)
	if f.timer == nil {
		f.timer = time.AfterFunc(d, f.r.flush)
	} else {
		f.timer.Reset(d)
	}
}

// flush runs at every phase: it selects what arrived since the last phase and writes one phase
// group what it has not had yet. When the room has grown or shrunk past another number of
// phases, every group first gets what it has not had, and the new phases start from there.
func (r *localRoom) flush() {
	f := &r.fanout
	f.mu.Lock()
	f.armed = false
	if f.stopped {
		f.mu.Unlock()
		return
	}
	now := r.t.n.now().UnixNano()
	if len(f.pending) > 0 {
		f.log = append(f.log, f.selectLocked(f.pending, time.Now(), r.t.n.flow.strength())...)
		if q, ok := thinnedMarker(f.dropped, f.droppedFor); ok {
			q.arrived = now
			f.log = append(f.log, q)
		}
		clear(f.pending)
		f.pending = f.pending[:0]
	}
	end := f.logBase + len(f.log)
	r.mu.RLock()
	want := phasesFor(r.size(), r.t.n.cfg.PhaseMembers, f.settings.tick)
	r.mu.RUnlock()

	var jobs []writeJob
	if want != f.phases {
		jobs = f.catchUpLocked()
		f.phases, f.phase = want, 0
		for g := range f.phases {
			f.sent[g] = end
		}
	} else {
		g := f.phase
		if unsent := f.log[f.sent[g]-f.logBase:]; len(unsent) > 0 && f.settings.due(unsent, now) {
			jobs = append(jobs, writeJob{unsent, g, f.phases})
			f.sent[g] = end
		}
		f.phase = (g + 1) % f.phases
	}
	// Drop what every group has had. The jobs keep their own slices of the old log.
	low := end
	for g := range f.phases {
		low = min(low, f.sent[g])
	}
	if low > f.logBase {
		f.log = f.log[low-f.logBase:]
		if len(f.log) == 0 {
			f.log = nil
		}
		f.logBase = low
	}
	if len(f.log) > 0 || len(f.pending) > 0 {
		f.armLocked()
	}
	write := f.queueLocked(jobs...)
	f.mu.Unlock()
	if write {
		r.drainWrites()
	}
}

// due reports whether a phase group's unsent log entries go out now rather than at the group's
// next turn, a tick later: always, unless the room has a latency budget longer than its tick.
// With one, a quiet room's frames wait to carry more: they go once gatherMessages messages
// wait, a critical one waits (critical messages keep the plain tick's latency, and take what
// waits with them), or the oldest entry would pass the budget by waiting another tick. A room
// busy enough to fill gatherMessages every tick keeps the plain tick's latency.
func (s roomSettings) due(unsent []queued, now int64) bool {
	if s.latencyBudget <= s.tick {
		return true
	}
	if now-unsent[0].arrived+int64(s.tick) > int64(s.latencyBudget) {
		return true
	}
	waiting := 0
	for _, q := range unsent {
		if q.m == nil { // a thinned marker
			continue
		}
		if lane(q.m) == clientpb.Lane_LANE_CRITICAL {
			return true
		}
		waiting++
	}
	return waiting >= s.gatherMessages
}

func lane(m *clientpb.Message) clientpb.Lane {
	if m.Lane <= clientpb.Lane_LANE_UNSPECIFIED || m.Lane > clientpb.Lane_LANE_BULK {
		return clientpb.Lane_LANE_NORMAL
	}
	return m.Lane
}

// variant is one set of messages as some members receive it, encoded once.
type variant struct {
	msgs    []queued
	byLane  [4]int
	thinned *clientpb.Thinned // left out since the group's previous write: by the room, and by the level
	encoded [][]byte
	done    bool // encoded is set
}

func newVariant(msgs []queued, keep func(i int, q queued) bool) *variant {
	v := &variant{msgs: make([]queued, 0, len(msgs))}
	for i, q := range msgs {
		if keep == nil || keep(i, q) {
			v.msgs = append(v.msgs, q)
			v.byLane[lane(q.m)]++
		}
	}
	return v
}

// frames returns the variant's Push frames (usually one; one without messages when it has only
// a thinned count; none when it has neither), encoded at the first call.
func (v *variant) frames() [][]byte {
	if !v.done {
		msgs := make([]*clientpb.Message, len(v.msgs))
		for i, q := range v.msgs {
			msgs[i] = q.m
		}
		v.encoded, v.done = pushFrames(msgs, pushMeta{thinned: v.thinned}), true
	}
	return v.encoded
}

// addThinned returns a plus normal and bulk (nil when all are zero).
func addThinned(a *clientpb.Thinned, normal, bulk int) *clientpb.Thinned {
	if normal == 0 && bulk == 0 {
		return a
	}
	return &clientpb.Thinned{Normal: a.GetNormal() + uint32(normal), Bulk: a.GetBulk() + uint32(bulk)}
}

// variantKey names a variant: which of the tick's messages the member may see (a bitset, ""
// when no message is targeted) and its backlog level.
type variantKey struct {
	audience string
	level    int
}

// write sends msgs to the members of phase group g of p (g = 0, p = 1: every member): the frame for each variant is encoded once and the same
// bytes go to every member that gets that variant. A message with a tag expression goes only to
// members whose tags satisfy it; the expression is evaluated once per distinct tag set in the
// room (once per member only if it reads uid). Members whose write backlog grows get thinner
// variants (no bulk, then critical only); a member that sent some of the messages gets them
// left out, so a sender sees a SendAck and no echo. Each variant's first frame counts what the
// room's budgets and flow control (the markers among msgs) and the variant's level left out.
// Only the room's writer calls it (drainWrites).
func (r *localRoom) write(msgs []queued, g, p int) {
	msgs, th := splitThinned(msgs)
	if len(msgs) == 0 && th.all == nil && th.byAudience == nil {
		return
	}
	roomThinned := th.all
	n := r.t.n
	var localSenders []string
	for _, q := range msgs {
		if node, ok := ids.SessionNode(q.sender); ok && node == n.cfg.Node {
			localSenders = append(localSenders, q.sender)
		}
	}
	aud := n.newAudiences(msgs, th.byAudience) // audience.go
	defer aud.release()

	variants := make(map[variantKey]*variant, 4)
	var full *variant                   // variants[variantKey{}], the one most members get, without a map lookup
	var get func(k variantKey) *variant // recursive: a level's variant is counted against the full one
	get = func(k variantKey) *variant {
		if k == (variantKey{}) && full != nil {
			return full
		}
		v := variants[k]
		if v == nil {
			keepLevel := levelFilter(k.level)
			v = newVariant(msgs, func(i int, q queued) bool {
				return (k.audience == "" || k.audience[i/8]&(1<<(i%8)) != 0) && (keepLevel == nil || keepLevel(q))
			})
			if k.level > 0 {
				all := get(variantKey{audience: k.audience})
				v.thinned = addThinned(all.thinned,
					all.byLane[clientpb.Lane_LANE_NORMAL]-v.byLane[clientpb.Lane_LANE_NORMAL], all.byLane[clientpb.Lane_LANE_BULK]-v.byLane[clientpb.Lane_LANE_BULK])
			} else if t := aud.thinnedOf(k.audience); t != nil {
				v.thinned = addThinned(roomThinned, int(t.Normal), int(t.Bulk))
			} else {
				v.thinned = roomThinned
			}
			variants[k] = v
		}
		if k == (variantKey{}) {
			full = v
		}
		return v
	}

	var delivered, slowDropped [4]int
	var frames, bytes int
	op := outPool.Get().(*[]out)
	outs := (*op)[:0]
	r.mu.RLock()
	r.each(g, p, func(c *conn) {
		lvl := n.backlogLevel(c)
		if lvl == levelClose {
			c.closeSlow()
			return
		}
		k := variantKey{level: lvl}
		if aud.targeted() {
			k.audience = aud.of(c)
		}
		v := get(k)
		if lvl > 0 {
			full := get(variantKey{audience: k.audience})
			for l := range slowDropped {
				slowDropped[l] += full.byLane[l] - v.byLane[l]
			}
		}
		if len(localSenders) > 0 && slices.Contains(localSenders, c.session) {
			own := newVariant(v.msgs, func(_ int, q queued) bool { return q.sender != c.session })
			own.thinned = v.thinned
			v = own
		}
		if fs := v.frames(); fs != nil {
			outs = append(outs, out{c, fs})
			for _, b := range fs {
				bytes += len(b)
			}
			frames += len(fs)
			for l, k := range v.byLane {
				delivered[l] += k
			}
		}
	})
	r.mu.RUnlock()
	n.writeOuts(outs)
	clear(outs) // the pool keeps no conns or frames
	*op = outs[:0]
	outPool.Put(op)

	n.egress.Add(uint64(bytes))
	n.m.pushFrames.Add(float64(frames))
	for l := range delivered {
		if delivered[l] > 0 {
			n.m.deliveries[l].Add(float64(delivered[l]))
		}
		if slowDropped[l] > 0 {
			n.m.drops[l][dropSlowReader].Add(float64(slowDropped[l]))
		}
	}
}
