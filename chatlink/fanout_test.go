package chatlink

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/tag"
)

func TestPhasesFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		size, per int
		tick      time.Duration
		want      int
	}{
		{0, 1024, 250 * time.Millisecond, 1},
		{1024, 1024, 250 * time.Millisecond, 1},
		{1025, 1024, 250 * time.Millisecond, 2},
		{15000, 1024, 250 * time.Millisecond, 16}, // 15.6 ms apart
		{15000, 1024, 100 * time.Millisecond, 8},  // 12.5 ms apart; 16 would be 6.25 ms
		{15000, 1024, 20 * time.Millisecond, 2},
		{1 << 20, 1024, time.Second, phaseSlots},
	} {
		if got := phasesFor(tc.size, tc.per, tc.tick); got != tc.want {
			t.Errorf("phasesFor(%d, %d, %v) = %d, want %d", tc.size, tc.per, tc.tick, got, tc.want)
		}
	}
}

// testRoom returns a room of a node with cfg (defaults applied) and room settings st, without
// NATS or sockets: the tests drive receive and flush themselves.
func testRoom(cfg Config, st *roompb.RoomSettings, now time.Time) *localRoom {
	n := &Node{cfg: testConfig(cfg)}
	n.m = newMetrics(nil, n)
	n.flow = newFlowController(0, n.cfg.FlowT1, n.cfg.FlowT2)
	n.exprs = tag.NewCache(n.cfg.ExprCacheSize)
	r := &localRoom{t: &roomTable{n: n}}
	r.fanout.init(r, st, now)
	return r
}

// testConfig returns cfg with defaults applied, for tests that run parts of a node without
// NATS: it names a bus and keys that the parts under test never use.
func testConfig(cfg Config) Config {
	cfg.Bus, cfg.Keys = new(nats.Conn), auth.Keyring{"app": []byte("unused")}
	cfg, err := cfg.withDefaults()
	if err != nil {
		panic(err)
	}
	return cfg
}

// testJoin adds a member whose frames go to t.
func (r *localRoom) testJoin(t transport) *conn {
	c := &conn{node: r.t.n, t: t}
	r.mu.Lock()
	r.add(c)
	r.mu.Unlock()
	return c
}

// receiveIDs hands the room a batch of critical messages with these ids, as from the bus.
func (r *localRoom) receiveIDs(ids ...string) { r.receiveLane(clientpb.Lane_LANE_CRITICAL, ids...) }

// pushRecorder is a transport that keeps the ids of the messages pushed to it, frame by frame.
type pushRecorder struct {
	mu      sync.Mutex
	frames  [][]string
	thinned int // normal and bulk, as the Pushes counted them
}

func (r *pushRecorder) write(b []byte) {
	var f clientpb.Frame
	if err := proto.Unmarshal(b, &f); err != nil {
		panic(err)
	}
	var ids []string
	for _, m := range f.GetPush().GetMessages() {
		ids = append(ids, m.Id)
	}
	r.mu.Lock()
	r.frames = append(r.frames, ids)
	r.thinned += int(f.GetPush().GetThinned().GetNormal() + f.GetPush().GetThinned().GetBulk())
	r.mu.Unlock()
}
func (r *pushRecorder) pending() int64                  { return 0 }
func (r *pushRecorder) kick(clientpb.CloseCode, []byte) {}
func (r *pushRecorder) forceClose()                     {}
func (r *pushRecorder) count() int                      { r.mu.Lock(); defer r.mu.Unlock(); return len(r.frames) }
func (r *pushRecorder) last() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.frames[len(r.frames)-1]
}
func (r *pushRecorder) ids() (out []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.frames {
		out = append(out, f...)
	}
	return out
}

// TestPhasedFlush drives a room's phases by hand (its tick is an hour, so the timer never
// fires): a room of 32 members at 4 members a phase flushes in 8 groups, one group per phase;
// every member gets every message once and in order, including messages that arrived while
// some groups had already had their share, and across a change in the number of phases.
func TestPhasedFlush(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1", PhaseMembers: 4}, &roompb.RoomSettings{FlushTickMs: 3_600_000}, time.Now())
	defer r.fanout.stop()

	var conns []*conn
	var recs []*pushRecorder
	join := func() {
		rec := &pushRecorder{}
		conns, recs = append(conns, r.testJoin(rec)), append(recs, rec)
	}
	for range 32 {
		join()
	}
	next := 0
	send := func(k int) {
		var ids []string
		for range k {
			ids = append(ids, strconv.Itoa(next))
			next++
		}
		r.receiveIDs(ids...)
	}
	// got returns how many members have had a new frame since counts were taken.
	counts := func() []int {
		out := make([]int, len(recs))
		for i, rec := range recs {
			out[i] = rec.count()
		}
		return out
	}
	newFrames := func(before []int) (members []int) {
		for i, rec := range recs {
			if i < len(before) && rec.count() > before[i] {
				members = append(members, i)
			}
		}
		return members
	}

	// The first flush finds 32 members where it had 1 phase: everyone gets 0–4 at once, and
	// the room goes to 8 phases.
	send(5)
	before := counts()
	r.flush()
	if got := newFrames(before); len(got) != 32 {
		t.Fatalf("the first flush wrote to %d members, want all 32", len(got))
	}
	if r.fanout.phases != 8 {
		t.Fatalf("phases = %d, want 8", r.fanout.phases)
	}

	// Each phase writes one group of 4, a different group each time.
	send(5) // 5–9
	seen := map[int]bool{}
	for phase := range 8 {
		before := counts()
		r.flush()
		got := newFrames(before)
		if len(got) != 4 {
			t.Fatalf("phase %d wrote to %d members, want 4", phase, len(got))
		}
		for _, i := range got {
			if seen[i] {
				t.Fatalf("phase %d wrote to member %d a second time", phase, i)
			}
			seen[i] = true
			if want := []string{"5", "6", "7", "8", "9"}; fmt.Sprint(recs[i].last()) != fmt.Sprint(want) {
				t.Fatalf("member %d got %v, want %v in one frame", i, recs[i].last(), want)
			}
		}
	}

	// Messages that arrive between phases: the groups not yet flushed get them merged with the
	// earlier ones, the others get them at their next phase.
	send(3) // 10–12
	for range 3 {
		r.flush()
	}
	send(2) // 13–14
	for range 8 {
		r.flush()
	}
	if len(r.fanout.log) != 0 {
		t.Fatalf("the log keeps %d messages every group has had", len(r.fanout.log))
	}

	// A member joins, 29 leave: the next flush finds 4 members, gives every group what it has
	// not had and goes back to one phase.
	join()    // member 32
	send(1)   // 15
	r.flush() // one group (of 8) gets 15
	r.mu.Lock()
	for _, c := range conns[4:32] {
		r.remove(c)
	}
	r.remove(conns[0])
	r.mu.Unlock()
	send(1) // 16
	r.flush()
	if r.fanout.phases != 1 {
		t.Fatalf("phases = %d with %d members, want 1", r.fanout.phases, r.size())
	}
	send(1) // 17
	r.flush()

	ids := func(from, to int) (out []string) {
		for i := from; i <= to; i++ {
			out = append(out, strconv.Itoa(i))
		}
		return out
	}
	for i, rec := range recs {
		got := rec.ids()
		var want []string
		switch {
		case i == 0 || i >= 4 && i < 32: // left before 16
			// It had 0–14 at least, and 15 if its group was the one flushed before it left.
			want = ids(0, 14)
			if len(got) == 16 {
				want = ids(0, 15)
			}
		case i < 4:
			want = ids(0, 17)
		default: // joined before 15
			want = ids(15, 17)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("member %d got %v, want %v", i, got, want)
		}
	}
}

// blockingRecorder is a pushRecorder whose first write waits for release.
type blockingRecorder struct {
	pushRecorder
	entered, release chan struct{}
	once             sync.Once
}

func (b *blockingRecorder) write(p []byte) {
	b.once.Do(func() {
		close(b.entered)
		<-b.release
	})
	b.pushRecorder.write(p)
}

// TestWritesQueueInOrder: while one goroutine is writing a room's frames, another that has
// frames for the room queues them and returns at once; they go out after the earlier ones.
func TestWritesQueueInOrder(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1"}, &roompb.RoomSettings{NoMerge: true}, time.Now())
	defer r.fanout.stop()
	rec := &blockingRecorder{entered: make(chan struct{}), release: make(chan struct{})}
	r.testJoin(rec)
	send := func(id string) { r.receiveIDs(id) }

	first := make(chan struct{})
	go func() { defer close(first); send("0") }()
	<-rec.entered // the first receive is writing, and waits
	second := make(chan struct{})
	go func() { defer close(second); send("1"); send("2") }()
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a receive waited for another goroutine's write")
	}
	close(rec.release)
	<-first
	if got := fmt.Sprint(rec.ids()); got != "[0 1 2]" {
		t.Fatalf("frames went out as %s, want [0 1 2]", got)
	}
}

// nullTransport takes frames and drops them.
type nullTransport struct{ n int }

func (t *nullTransport) write([]byte)                    { t.n++ }
func (t *nullTransport) pending() int64                  { return 0 }
func (t *nullTransport) kick(clientpb.CloseCode, []byte) {}
func (t *nullTransport) forceClose()                     {}

// BenchmarkRoomWrite measures the fan-out's own work per member and tick, without the socket:
// a tick of 5 messages written to a room of 1,000 members (one variant, encoded once).
func BenchmarkRoomWrite(b *testing.B) {
	r := testRoom(Config{Node: "n1"}, nil, time.Now())
	const members = 1000
	for range members {
		r.testJoin(&nullTransport{})
	}
	var tick []queued
	for i := range 5 {
		tick = append(tick, queued{m: &clientpb.Message{Id: strconv.Itoa(i), Lane: clientpb.Lane_LANE_CRITICAL, Body: make([]byte, 64)}})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r.write(tick, 0, 1)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*members), "ns/member")
}

// TestPhasedThenUnmerged: a phased room switched to no_merge gives the groups that have not had
// the merged messages yet those messages first, then the unmerged one, to every member once.
func TestPhasedThenUnmerged(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1", PhaseMembers: 4}, &roompb.RoomSettings{FlushTickMs: 3_600_000}, time.Now()) // the test flushes
	defer r.fanout.stop()
	var recs []*pushRecorder
	for range 32 {
		rec := &pushRecorder{}
		r.testJoin(rec)
		recs = append(recs, rec)
	}
	send := r.receiveIDs
	send("0")
	r.flush() // everyone gets 0; 8 phases from here
	send("1")
	r.flush() // one group of 8 gets 1
	r.flush() // a second
	r.fanout.setSettings(&roompb.RoomSettings{FlushTickMs: 3_600_000, NoMerge: true})
	send("2")
	r.flush() // nothing left for it to do
	for i, rec := range recs {
		if got := fmt.Sprint(rec.ids()); got != "[0 1 2]" {
			t.Errorf("member %d got %s, want [0 1 2]", i, got)
		}
	}
}

// receiveLane hands the room a batch of messages of one lane with these ids, as from the bus.
func (r *localRoom) receiveLane(l clientpb.Lane, ids ...string) {
	var b buspb.RoomBatch
	for _, id := range ids {
		b.Messages = append(b.Messages, &clientpb.Message{Id: id, Lane: l})
	}
	data, err := proto.Marshal(&b)
	if err != nil {
		panic(err)
	}
	r.receive(data)
}

// TestLatencyBudget drives a room with a latency budget by hand (its tick is an hour, so the
// timer never fires; the budget's ages are on a fake clock): normal and bulk messages wait for
// company until gather_messages of them wait, a critical one comes, or another tick would pass
// the budget; without a budget every flush writes what arrived.
func TestLatencyBudget(t *testing.T) {
	t.Parallel()
	const tick = time.Hour
	settings := &roompb.RoomSettings{FlushTickMs: uint32(tick.Milliseconds()), LatencyBudgetMs: uint32((4 * tick).Milliseconds()), GatherMessages: 3}
	normal, bulk, critical := clientpb.Lane_LANE_NORMAL, clientpb.Lane_LANE_BULK, clientpb.Lane_LANE_CRITICAL
	type step struct {
		advance time.Duration // the fake clock moves on by this before the flush
		lane    clientpb.Lane
		ids     []string // received before the flush
		want    []string // the frame the flush writes; nil: none
	}
	for _, tc := range []struct {
		name     string
		settings *roompb.RoomSettings
		node     time.Duration // Config.LatencyBudget
		steps    []step
	}{
		{"gathers until enough wait", settings, 0, []step{
			{0, normal, []string{"a"}, nil},
			{time.Minute, bulk, []string{"b"}, nil},
			{time.Minute, normal, []string{"c", "d"}, []string{"a", "b", "c", "d"}},
			{time.Minute, normal, []string{"e"}, nil},
		}},
		{"goes before the budget passes", settings, 0, []step{
			{0, normal, []string{"a"}, nil},
			{tick, normal, []string{"b"}, nil},
			{2*tick - time.Second, normal, nil, nil},           // a waited 3h-1s: another tick is within 4h
			{time.Second + 1, normal, nil, []string{"a", "b"}}, // a waited 3h+1ns: another tick would pass 4h
		}},
		{"critical takes what waits", settings, 0, []step{
			{0, normal, []string{"a"}, nil},
			{time.Minute, critical, []string{"b"}, []string{"a", "b"}},
			{time.Minute, critical, []string{"c"}, []string{"c"}},
		}},
		{"busy room keeps the tick", settings, 0, []step{
			{0, normal, []string{"a", "b", "c"}, []string{"a", "b", "c"}},
			{time.Minute, bulk, []string{"d", "e", "f"}, []string{"d", "e", "f"}},
		}},
		{"off: every flush writes", &roompb.RoomSettings{FlushTickMs: uint32(tick.Milliseconds())}, 0, []step{
			{0, normal, []string{"a"}, []string{"a"}},
			{time.Minute, normal, []string{"b"}, []string{"b"}},
		}},
		{"budget not above the tick: off", &roompb.RoomSettings{FlushTickMs: uint32(tick.Milliseconds()), LatencyBudgetMs: uint32(tick.Milliseconds())}, 0, []step{
			{0, normal, []string{"a"}, []string{"a"}},
		}},
		{"node default budget", &roompb.RoomSettings{FlushTickMs: uint32(tick.Milliseconds())}, 4 * tick, []step{
			{0, normal, []string{"a", "b", "c"}, nil}, // the node's default gathers 4
			{time.Minute, normal, []string{"d"}, []string{"a", "b", "c", "d"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := testkit.NewClock(time.Unix(1_700_000_000, 0))
			r := testRoom(Config{Node: "n1", Now: clock.Now, LatencyBudget: tc.node}, tc.settings, clock.Now())
			defer r.fanout.stop()
			rec := &pushRecorder{}
			r.testJoin(rec)
			for i, s := range tc.steps {
				clock.Add(s.advance)
				if len(s.ids) > 0 {
					r.receiveLane(s.lane, s.ids...)
				}
				before := rec.count()
				r.flush()
				switch got := rec.count() - before; {
				case s.want == nil && got != 0:
					t.Fatalf("step %d: the flush wrote %v, want nothing yet", i, rec.last())
				case s.want != nil && got != 1:
					t.Fatalf("step %d: the flush wrote %d frames, want one of %v", i, got, s.want)
				case s.want != nil && fmt.Sprint(rec.last()) != fmt.Sprint(s.want):
					t.Fatalf("step %d: the flush wrote %v, want %v", i, rec.last(), s.want)
				}
			}
		})
	}
}

// TestLatencyBudgetPhases: in a room flushed in phase groups each group decides at its own turn,
// and what a group holds back stays in the log until it has had it.
func TestLatencyBudgetPhases(t *testing.T) {
	t.Parallel()
	const tick = time.Hour
	clock := testkit.NewClock(time.Unix(1_700_000_000, 0))
	r := testRoom(Config{Node: "n1", PhaseMembers: 1, Now: clock.Now},
		&roompb.RoomSettings{FlushTickMs: uint32(tick.Milliseconds()), LatencyBudgetMs: uint32((4 * tick).Milliseconds()), GatherMessages: 3}, clock.Now())
	defer r.fanout.stop()
	recs := []*pushRecorder{{}, {}}
	for _, rec := range recs {
		r.testJoin(rec)
	}
	r.flush() // two members at one a phase: two groups from here on
	if r.fanout.phases != 2 {
		t.Fatalf("phases = %d, want 2", r.fanout.phases)
	}
	want := func(step string, frames ...int) {
		t.Helper()
		for i, rec := range recs {
			if rec.count() != frames[i] {
				t.Fatalf("%s: member %d has %d frames, want %d", step, i, rec.count(), frames[i])
			}
		}
	}
	r.receiveLane(clientpb.Lane_LANE_NORMAL, "a")
	r.flush()
	r.flush()
	want("one message, both turns", 0, 0)

	// The first group's turn comes after the budget's last tick: it gets a; the second group's
	// turn comes before a critical message and so gets a with it.
	clock.Add(3*tick + 1)
	r.flush()
	want("past the budget, first group", 1, 0)
	r.receiveLane(clientpb.Lane_LANE_CRITICAL, "b")
	r.flush()
	want("critical, second group", 1, 1)
	if got := fmt.Sprint(recs[0].last(), recs[1].last()); got != "[a] [a b]" {
		t.Fatalf("frames %s, want [a] [a b]", got)
	}
	r.flush()
	want("first group's turn again", 2, 1)
	if got := fmt.Sprint(recs[0].last()); got != "[b]" {
		t.Fatalf("first group's second frame %s, want [b]", got)
	}
	if len(r.fanout.log) != 0 {
		t.Fatalf("the log keeps %d entries every group has had", len(r.fanout.log))
	}
}
