package chatlink

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/tag"
)

func testFanout(t *testing.T, st *roompb.RoomSettings) (*roomFanout, time.Time) {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	r := testRoom(Config{Node: "n1"}, st, now)
	r.testJoin(&nullTransport{}) // budgets apply to what members would receive
	return &r.fanout, now
}

func msgs(lanes ...clientpb.Lane) []queued {
	out := make([]queued, len(lanes))
	for i, l := range lanes {
		out[i] = queued{m: &clientpb.Message{Id: fmt.Sprint(i), Lane: l}}
	}
	return out
}

func repeat(l clientpb.Lane, n int) []clientpb.Lane {
	out := make([]clientpb.Lane, n)
	for i := range out {
		out[i] = l
	}
	return out
}

func TestBudgetSamplesSpreadOverTheSecond(t *testing.T) {
	t.Parallel()
	f, now := testFanout(t, nil) // 20 normal a second, 100 ms ticks
	kept := 0
	var ids []string
	for tick := 0; tick < 10; tick++ {
		now = now.Add(100 * time.Millisecond)
		got := f.selectLocked(msgs(repeat(clientpb.Lane_LANE_NORMAL, 50)...), now, 0)
		kept += len(got)
		if tick == 0 {
			for _, q := range got {
				ids = append(ids, q.m.Id)
			}
		}
		if len(got) > 3 {
			t.Fatalf("tick %d kept %d of 50: a budget of 20/s allows about 2 a tick", tick, len(got))
		}
	}
	if kept < 18 || kept > 22 {
		t.Fatalf("kept %d in a second, want about 20", kept)
	}
	// Not a prefix: the kept ones are spread through the tick.
	if len(ids) != 2 || ids[0] == "0" || ids[1] != "49" {
		t.Fatalf("first tick kept %v, want an even spread ending at the last message", ids)
	}
}

func TestBudgetKeepsNormalBeforeBulkAndCriticalAlways(t *testing.T) {
	t.Parallel()
	f, now := testFanout(t, &roompb.RoomSettings{NormalBudget: 30, FlushTickMs: 100}) // 3 a tick
	lanes := append(append(repeat(clientpb.Lane_LANE_BULK, 10), repeat(clientpb.Lane_LANE_NORMAL, 2)...), repeat(clientpb.Lane_LANE_CRITICAL, 40)...)
	got := f.selectLocked(msgs(lanes...), now.Add(100*time.Millisecond), 0)
	var byLane [4]int
	for _, q := range got {
		byLane[q.m.Lane]++
	}
	if byLane[clientpb.Lane_LANE_CRITICAL] != 40 || byLane[clientpb.Lane_LANE_NORMAL] != 2 || byLane[clientpb.Lane_LANE_BULK] != 1 {
		t.Fatalf("kept by lane %v, want all 40 critical, both normal, one bulk", byLane)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].m.Id >= got[i].m.Id && len(got[i-1].m.Id) >= len(got[i].m.Id) {
			t.Fatalf("order lost: %s before %s", got[i-1].m.Id, got[i].m.Id)
		}
	}
}

func TestUnlimitedBudgetAndFullStrength(t *testing.T) {
	t.Parallel()
	f, now := testFanout(t, &roompb.RoomSettings{NormalBudget: -1, CriticalBudget: -1})
	lanes := append(append(repeat(clientpb.Lane_LANE_BULK, 100), repeat(clientpb.Lane_LANE_NORMAL, 100)...), repeat(clientpb.Lane_LANE_CRITICAL, 100)...)
	if got := f.selectLocked(msgs(lanes...), now, 0); len(got) != 300 {
		t.Fatalf("unlimited budget kept %d of 300", len(got))
	}
	// At full strength only critical survives, all of it.
	got := f.selectLocked(msgs(lanes...), now.Add(time.Second), 1)
	for _, q := range got {
		if q.m.Lane != clientpb.Lane_LANE_CRITICAL {
			t.Fatalf("strength 1 kept a %v message", q.m.Lane)
		}
	}
	if len(got) != 100 {
		t.Fatalf("strength 1 kept %d critical of 100", len(got))
	}
	// At strength 0.25 half the bulk goes, evenly.
	got = f.selectLocked(msgs(repeat(clientpb.Lane_LANE_BULK, 100)...), now.Add(2*time.Second), 0.25)
	if len(got) != 50 {
		t.Fatalf("strength 0.25 kept %d of 100 bulk, want 50", len(got))
	}
}

// TestBudgetPerAudienceCountsWhatEachLosesOut: a class over its budget is thinned and its
// members learn how much; a class within its budget gets all of its messages, whatever the
// other class sends, and is told of nothing thinned.
func TestBudgetPerAudienceCountsWhatEachLosesOut(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1"}, nil, time.Now()) // 20 a second: 2 a 100 ms tick
	defer r.fanout.stop()
	tags := tag.NewInterner()
	join := func(class string) *pushRecorder {
		rec := &pushRecorder{}
		c := &conn{node: r.t.n, t: rec}
		c.tags.Store(tags.Intern([]string{class}))
		r.mu.Lock()
		r.add(c)
		r.mu.Unlock()
		return rec
	}
	busy := []*pushRecorder{join("busy"), join("busy")}
	quiet := []*pushRecorder{join("quiet"), join("quiet")}

	var b buspb.RoomBatch
	for i := range 10 {
		b.Messages = append(b.Messages, &clientpb.Message{Id: fmt.Sprint("b", i), Lane: clientpb.Lane_LANE_NORMAL, TagExpr: `"busy" in tags`})
	}
	b.Messages = append(b.Messages, &clientpb.Message{Id: "q", Lane: clientpb.Lane_LANE_NORMAL, TagExpr: `"quiet" in tags`})
	data, err := proto.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	r.receive(data)

	received := func(rec *pushRecorder) (int, int) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, f := range rec.frames {
			n += len(f)
		}
		return n, rec.thinned
	}
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		for _, rec := range busy {
			if got, thinned := received(rec); got+thinned != 10 {
				return fmt.Errorf("a busy member got %d and was told of %d thinned, want 10 in all", got, thinned)
			}
		}
		for _, rec := range quiet {
			if got, thinned := received(rec); got != 1 || thinned != 0 {
				return fmt.Errorf("a quiet member got %d and was told of %d thinned, want its 1 and none thinned", got, thinned)
			}
		}
		return nil
	})
	for _, rec := range busy {
		if got, _ := received(rec); got < 1 || got > 3 {
			t.Fatalf("a busy member got %d of its 10, want its budget's 2 (or 3 with the time the test took)", got)
		}
	}
}
