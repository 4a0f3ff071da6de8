package chatlink

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/ids"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// Default delivery settings of a room, when the room service gives none.
const (
	defaultFlushTick      = 100 * time.Millisecond
	defaultNormalBudget   = 20
	defaultCriticalBudget = 10
)

// roomSettings are a room's delivery settings with defaults applied.
type roomSettings struct {
	tick           time.Duration
	merge          bool
	normalBudget   float64 // messages per member per second; negative: unlimited
	criticalBudget float64 // counted only; negative: unlimited
}

func resolveSettings(st *pb.RoomSettings, defTick time.Duration) roomSettings {
	s := roomSettings{tick: defTick, merge: true, normalBudget: defaultNormalBudget, criticalBudget: defaultCriticalBudget}
	if st == nil {
		return s
	}
	if st.FlushTickMs > 0 {
		s.tick = time.Duration(st.FlushTickMs) * time.Millisecond
	}
	s.merge = !st.NoMerge
	if st.NormalBudget != 0 {
		s.normalBudget = float64(st.NormalBudget)
	}
	if st.CriticalBudget != 0 {
		s.criticalBudget = float64(st.CriticalBudget)
	}
	return s
}

// queued is a message waiting for its room's next flush, with the session that sent it.
type queued struct {
	m      *pb.Message
	sender string
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

	mu             sync.Mutex // guards the fields below
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
	normalTokens   float64
	criticalTokens float64
	refilledAt     time.Time
	fcCarry        [4]float64 // flow-control sampling carry, by lane

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

func (f *roomFanout) init(r *localRoom, st *pb.RoomSettings, now time.Time) {
	f.r = r
	f.settings = resolveSettings(st, r.t.n.cfg.FlushTick)
	f.phases = 1
	f.refilledAt = now
	f.normalTokens, f.criticalTokens = tokenCap(f.settings.normalBudget, f.settings.tick), tokenCap(f.settings.criticalBudget, f.settings.tick)
}

// setSettings replaces the room's settings, as an announcement of a change does.
func (f *roomFanout) setSettings(st *pb.RoomSettings) {
	f.mu.Lock()
	f.settings = resolveSettings(st, f.r.t.n.cfg.FlushTick)
	f.mu.Unlock()
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
}

// receive takes a room batch off the bus.
func (r *localRoom) receive(data []byte) {
	n := r.t.n
	var batch pb.RoomBatch
	if err := proto.Unmarshal(data, &batch); err != nil {
		n.log.Warn("dropping room batch that does not parse", "subject", r.subject)
		return
	}
	f := &r.fanout
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	if batch.Settings != nil {
		f.settings = resolveSettings(batch.Settings, n.cfg.FlushTick)
	}
	for i, m := range batch.Messages {
		q := queued{m: m}
		if i < len(batch.SenderSessions) {
			q.sender = batch.SenderSessions[i]
		}
		f.pending = append(f.pending, q)
	}
	switch {
	case len(f.pending) == 0:
		f.mu.Unlock()
	case !f.settings.merge:
		// Unmerged: every message at once, as its own frame.
		// Phase groups that have not had all of the merged log (the room was merged a moment
		// ago) get it first.
		jobs := f.catchUpLocked()
		msgs := f.selectLocked(f.pending, time.Now(), n.flow.strength())
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
	if len(f.pending) > 0 {
		f.log = append(f.log, f.selectLocked(f.pending, time.Now(), r.t.n.flow.strength())...)
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
		if f.sent[g] < end {
			jobs = append(jobs, writeJob{f.log[f.sent[g]-f.logBase:], g, f.phases})
		}
		f.sent[g] = end
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

// tokenCap is how many messages of a budget may go out at once: one tick's worth (at least
// 100 ms worth, and at least one), so a burst is spread over the second instead of taking the
// whole second's budget at its start.
func tokenCap(budget float64, tick time.Duration) float64 {
	if budget < 0 {
		return 0
	}
	return max(1, budget*max(tick, 100*time.Millisecond).Seconds())
}

// selectLocked applies the room's budgets and the node's flow control to a tick's messages and
// returns those to deliver, in order. Critical messages are never dropped. Over budget, normal
// messages are kept before bulk ones, and the kept ones are spread evenly over the tick rather
// than being its first few. Caller holds f.mu.
func (f *roomFanout) selectLocked(msgs []queued, now time.Time, strength float64) []queued {
	n := f.r.t.n
	s := f.settings
	elapsed := now.Sub(f.refilledAt).Seconds()
	f.refilledAt = now
	var count [4]int
	for _, q := range msgs {
		count[lane(q.m)]++
	}

	// Budgets: how many of each lane may go.
	allowed := count
	if s.normalBudget >= 0 {
		f.normalTokens = min(tokenCap(s.normalBudget, s.tick), f.normalTokens+s.normalBudget*elapsed)
		k := int(f.normalTokens)
		allowed[pb.Lane_LANE_NORMAL] = min(count[pb.Lane_LANE_NORMAL], k)
		allowed[pb.Lane_LANE_BULK] = min(count[pb.Lane_LANE_BULK], k-allowed[pb.Lane_LANE_NORMAL])
		f.normalTokens -= float64(allowed[pb.Lane_LANE_NORMAL] + allowed[pb.Lane_LANE_BULK])
	}
	if s.criticalBudget >= 0 {
		f.criticalTokens = min(tokenCap(s.criticalBudget, s.tick), f.criticalTokens+s.criticalBudget*elapsed)
		if over := float64(count[pb.Lane_LANE_CRITICAL]) - f.criticalTokens; over > 0 {
			n.m.criticalOverBudget.Add(over)
		}
		f.criticalTokens = max(0, f.criticalTokens-float64(count[pb.Lane_LANE_CRITICAL]))
	}

	keepNormal, keepBulk := keepFractions(strength)
	keepFrac := [4]float64{1, 1, keepNormal, keepBulk}
	kept := msgs[:0] // filtering in place: msgs is not used after
	var seen [4]int
	var dropped [4][2]int // by lane: budget, flow control
	for _, q := range msgs {
		l := lane(q.m)
		i := seen[l]
		seen[l]++
		// Budget: keep message i of the lane's count[l] when it crosses the next multiple of
		// count/allowed: an even spread.
		if allowed[l] < count[l] && (i+1)*allowed[l]/count[l] == i*allowed[l]/count[l] {
			dropped[l][0]++
			continue
		}
		if l != pb.Lane_LANE_CRITICAL {
			f.fcCarry[l] += keepFrac[l]
			if f.fcCarry[l] < 1 {
				dropped[l][1]++
				continue
			}
			f.fcCarry[l]--
		}
		kept = append(kept, q)
	}
	for l := range dropped {
		if d := dropped[l][0]; d > 0 {
			n.m.drops[l][dropBudget].Add(float64(d))
		}
		if d := dropped[l][1]; d > 0 {
			n.m.drops[l][dropFlowControl].Add(float64(d))
		}
	}
	return kept
}

func lane(m *pb.Message) pb.Lane {
	if m.Lane <= pb.Lane_LANE_UNSPECIFIED || m.Lane > pb.Lane_LANE_BULK {
		return pb.Lane_LANE_NORMAL
	}
	return m.Lane
}

// variant is one set of messages as some members receive it, encoded once.
type variant struct {
	msgs    []queued
	byLane  [4]int
	encoded [][]byte
}

func newVariant(msgs []queued, keep func(i int, q queued) bool) *variant {
	v := &variant{}
	for i, q := range msgs {
		if keep == nil || keep(i, q) {
			v.msgs = append(v.msgs, q)
			v.byLane[lane(q.m)]++
		}
	}
	return v
}

// frames returns the variant's Push frames (usually one), encoded at the first call.
func (v *variant) frames() [][]byte {
	if v.encoded == nil && len(v.msgs) > 0 {
		msgs := make([]*pb.Message, len(v.msgs))
		for i, q := range v.msgs {
			msgs[i] = q.m
		}
		v.encoded = pushFrames(msgs, false)
	}
	return v.encoded
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
// left out, so a sender sees a SendAck and no echo. Only the room's writer calls it
// (drainWrites).
func (r *localRoom) write(msgs []queued, g, p int) {
	if len(msgs) == 0 {
		return
	}
	n := r.t.n
	var localSenders []string
	var exprs []*tag.Expr // by message; nil when no message is targeted
	perMember := false
	for i, q := range msgs {
		if node, ok := ids.SessionNode(q.sender); ok && node == n.cfg.Node {
			localSenders = append(localSenders, q.sender)
		}
		if q.m.TagExpr != "" {
			if exprs == nil {
				exprs = make([]*tag.Expr, len(msgs))
			}
			exprs[i] = n.expr(q.m.TagExpr)
			perMember = perMember || exprs[i].UsesUID()
		}
	}

	variants := make(map[variantKey]*variant, 4)
	var full *variant // variants[variantKey{}], the one most members get, without a map lookup
	get := func(k variantKey) *variant {
		if k == (variantKey{}) && full != nil {
			return full
		}
		v := variants[k]
		if v == nil {
			keepLevel := levelFilter(k.level)
			v = newVariant(msgs, func(i int, q queued) bool {
				return (k.audience == "" || k.audience[i/8]&(1<<(i%8)) != 0) && (keepLevel == nil || keepLevel(q))
			})
			variants[k] = v
		}
		if k == (variantKey{}) {
			full = v
		}
		return v
	}
	var audiences map[*tag.Set]string // this tick's audience bitset per tag set
	if exprs != nil {
		audiences = make(map[*tag.Set]string)
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
		if exprs != nil {
			set := c.tags.Load()
			aud, ok := audiences[set]
			if !ok || perMember {
				aud = audience(exprs, set, c.uid)
				audiences[set] = aud
			}
			k.audience = aud
		}
		v := get(k)
		if lvl > 0 {
			full := get(variantKey{audience: k.audience})
			for l := range slowDropped {
				slowDropped[l] += full.byLane[l] - v.byLane[l]
			}
		}
		if len(localSenders) > 0 && slices.Contains(localSenders, c.session) {
			v = newVariant(v.msgs, func(_ int, q queued) bool { return q.sender != c.session })
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

// audience returns the bitset of the messages a member with tag set set and uid may see: bit i
// is set when message i has no tag expression or the member satisfies it.
func audience(exprs []*tag.Expr, set *tag.Set, uid string) string {
	bits := make([]byte, (len(exprs)+7)/8)
	for i, e := range exprs {
		if e == nil || e.Eval(set, uid) {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return string(bits)
}

// levelFilter returns what a member at backlog level lvl still gets.
func levelFilter(lvl int) func(queued) bool {
	switch lvl {
	case levelThin:
		return func(q queued) bool { return lane(q.m) != pb.Lane_LANE_BULK }
	case levelCriticalOnly:
		return func(q queued) bool { return lane(q.m) == pb.Lane_LANE_CRITICAL }
	}
	return nil
}
