package loadgen

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"roomcast/tag"
)

// TestTaggingMembers checks the members' tags: G distinct sets, each group in its class.
func TestTaggingMembers(t *testing.T) {
	t.Parallel()
	for _, g := range []int{1, 8, 10, 500} {
		tg := tagging{groups: g}
		sets := map[string]bool{}
		for i := range 3 * g {
			tags := tg.memberTags(i)
			if err := tag.Validate(tags); err != nil {
				t.Fatalf("G=%d member %d: %v", g, i, err)
			}
			grp := tg.group(i)
			want := []string{fmt.Sprintf("g:%d", grp), fmt.Sprintf("c:%d", grp%10)}
			if grp != i%g || !slices.Equal(tags, want) {
				t.Errorf("G=%d member %d: group %d tags %v, want %d %v", g, i, grp, tags, i%g, want)
			}
			sets[fmt.Sprint(tag.Canonical(tags))] = true
		}
		if len(sets) != g {
			t.Errorf("G=%d: %d distinct tag sets", g, len(sets))
		}
	}
	untargeted := tagging{}
	if untargeted.memberTags(5) != nil || untargeted.group(5) != 0 || untargeted.numGroups() != 1 {
		t.Error("an untargeted run tags its members")
	}
}

// TestTaggingExprMatchesAudience evaluates each message's expression with the server's own
// tag language against every group's tags: it must select exactly the groups selects says.
// Under -short it checks the first 200 messages of each scheme (every pairing of classes comes
// within 180), not 2000.
func TestTaggingExprMatchesAudience(t *testing.T) {
	t.Parallel()
	messages := uint64(2000)
	if testing.Short() {
		messages = 200
	}
	for _, g := range []int{1, 3, 8, 10, 37, 500} {
		tg := tagging{groups: g}
		for seq := range messages {
			target := tg.target(seq)
			src := target.expr()
			e, err := tag.Compile(src)
			if err != nil {
				t.Fatalf("G=%d message %d: %q: %v", g, seq, src, err)
			}
			for grp := range g {
				if got, want := e.EvalTags(tg.memberTags(grp), "u"), target.selects(grp); got != want {
					t.Fatalf("G=%d message %d %q for group %d (tags %v): expression says %v, selects %v",
						g, seq, src, grp, tg.memberTags(grp), got, want)
				}
			}
		}
	}
}

func TestTaggingTargets(t *testing.T) {
	t.Parallel()
	tg := tagging{groups: 500}
	for _, tc := range []struct {
		seq  uint64
		expr string
	}{
		{0, `"c:0" in tags`},
		{1, `"c:0" in tags || "c:1" in tags || "g:0" in tags`},
		{6, `"c:3" in tags`},
		{7, `"c:3" in tags || "c:4" in tags || "g:257" in tags`},  // 3*7919 mod 500
		{21, `"c:0" in tags || "c:2" in tags || "g:190" in tags`}, // k=0, k'=0+1+1, 10*7919 mod 500
	} {
		if got := tg.target(tc.seq).expr(); got != tc.expr {
			t.Errorf("message %d: %s, want %s", tc.seq, got, tc.expr)
		}
	}
	// Over 20 consecutive messages every class is targeted alone once; the second class of a
	// several-tag message is never the first.
	alone := map[int]int{}
	for seq := range uint64(20) {
		target := tg.target(seq)
		if seq%2 == 0 {
			alone[target.classes[0]]++
			if target.classes[1] != -1 || target.group != -1 {
				t.Errorf("message %d: %+v is not one class", seq, target)
			}
		} else if target.classes[0] == target.classes[1] || target.group < 0 {
			t.Errorf("message %d: %+v", seq, target)
		}
	}
	if len(alone) != 10 {
		t.Errorf("classes targeted alone in 20 messages: %v", alone)
	}
	if e := (tagging{}).target(3); !e.all || e.expr() != "" || !e.selects(7) {
		t.Errorf("untargeted message: %+v", e)
	}
}

// TestAudienceSizes checks the figures the benchmark comparison rests on: 15,000 members in
// 500 groups of 30, so a class is 1,500 members, a two-class message 3,000 and its group adds
// 30 unless the group is in one of the two classes.
func TestAudienceSizes(t *testing.T) {
	t.Parallel()
	tg := tagging{groups: 500}
	byGroup := make([]int64, 500)
	for i := range 15000 {
		byGroup[tg.group(i)]++
	}
	var total int64
	const msgs = 3000
	for seq := range uint64(msgs) {
		target := tg.target(seq)
		n := target.audienceSize(byGroup)
		total += n
		switch {
		case seq%2 == 0 && n != 1500:
			t.Errorf("message %d (%s) reaches %d, want 1500", seq, target.expr(), n)
		case seq%2 == 1 && n != 3000 && n != 3030:
			t.Errorf("message %d (%s) reaches %d, want 3000 or 3030", seq, target.expr(), n)
		case seq%2 == 1 && (n == 3000) != (target.group%10 == target.classes[0] || target.group%10 == target.classes[1]):
			t.Errorf("message %d (%s) reaches %d", seq, target.expr(), n)
		}
	}
	mean := float64(total) / msgs
	t.Logf("mean audience over %d messages: %.1f of 15000 (%.4f)", msgs, mean, mean/15000)
	if mean < 2250 || mean > 2265 {
		t.Errorf("mean audience %.1f, want about 2250 + 30 * 8/10 / 2 = 2262", mean)
	}
	if got := (tagging{}).target(5).audienceSize([]int64{15000}); got != 15000 {
		t.Errorf("untargeted audience %d", got)
	}
}

func TestExpectedByGroup(t *testing.T) {
	t.Parallel()
	tg := tagging{groups: 8}
	var acc seqSet
	for _, seq := range []uint64{0, 1, 2, 3, 9, 200} {
		acc.add(seq)
	}
	got := tg.expectedByGroup(acc)
	want := make([]int64, 8)
	acc.each(func(seq uint64) {
		for g := range want {
			if tg.target(seq).selects(g) {
				want[g]++
			}
		}
	})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("expectedByGroup = %v, want %v", got, want)
	}
	// Messages 0 and 2 go to classes 0 and 1 alone: group 0 gets 0, group 1 gets 2.
	if got[0] < 1 || got[1] < 1 {
		t.Errorf("expectedByGroup = %v", got)
	}
	if got := (tagging{}).expectedByGroup(acc); !reflect.DeepEqual(got, []int64{6}) {
		t.Errorf("untargeted expectedByGroup = %v, want [6]", got)
	}
	if got := (tagging{}).expectedByGroup(nil); !reflect.DeepEqual(got, []int64{0}) {
		t.Errorf("nothing accepted: %v", got)
	}
}

func TestSeqSet(t *testing.T) {
	t.Parallel()
	var s seqSet
	in := []uint64{0, 5, 63, 64, 65, 1000, 5}
	for _, seq := range in {
		s.add(seq)
	}
	if s.len() != 6 {
		t.Errorf("len %d, want 6", s.len())
	}
	for _, seq := range []uint64{0, 5, 63, 64, 65, 1000} {
		if !s.has(seq) {
			t.Errorf("lacks %d", seq)
		}
	}
	if s.has(1) || s.has(999) || s.has(1<<40) {
		t.Error("has a number never added")
	}
	var got []uint64
	s.each(func(seq uint64) { got = append(got, seq) })
	if !slices.Equal(got, []uint64{0, 5, 63, 64, 65, 1000}) {
		t.Errorf("each: %v", got)
	}
	// It travels to worker processes as JSON.
	b, err := json.Marshal(workerCmd{Accepted: s, WaitMS: 5})
	if err != nil {
		t.Fatal(err)
	}
	var back workerCmd
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Accepted, s) {
		t.Errorf("JSON round trip: %v, %v", back.Accepted, err)
	}
}

// TestMemberReceiveFlagsLeaks checks that a message delivered outside its audience is counted
// as leaked, not as a delivery.
func TestMemberReceiveFlagsLeaks(t *testing.T) {
	t.Parallel()
	run := runID{9}
	tg := tagging{groups: 8}
	f := newFleet(spec{Run: run, Tags: 8}, nil)
	m := &member{f: f, idx: 3, group: tg.group(3)}
	var in, out []uint64
	for seq := range uint64(40) {
		if tg.target(seq).selects(m.group) {
			in = append(in, seq)
		} else {
			out = append(out, seq)
		}
	}
	if len(in) == 0 || len(out) == 0 {
		t.Fatalf("group 3: in %v, out %v", in, out)
	}
	for _, seq := range append(slices.Clone(in), out...) {
		m.receive(pbMessage(appendBody(nil, run, seq, time.Now().UnixNano(), 24)))
	}
	if m.distinct.Load() != int64(len(in)) || m.leaked != int64(len(out)) {
		t.Errorf("distinct %d leaked %d, want %d and %d", m.distinct.Load(), m.leaked, len(in), len(out))
	}
	// Workers' leaks and members by group add up.
	total := merge([]report{{Leaked: 2, Groups: []int64{1, 2}}, {Leaked: 3, Groups: []int64{4, 0}}})
	if total.Leaked != 5 || !slices.Equal(total.Groups, []int64{5, 2}) {
		t.Errorf("merged leaked %d groups %v", total.Leaked, total.Groups)
	}
	if !(FanoutResult{N: 1, Connected: 1, Published: 1}).OK() || (FanoutResult{N: 1, Connected: 1, Published: 1, Leaked: 1}).OK() {
		t.Error("a leak does not fail the run")
	}
}
