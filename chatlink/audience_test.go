package chatlink

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// joinTagged adds a member with tags and uid to r.
func (r *localRoom) joinTagged(in *tag.Interner, t transport, uid string, tags ...string) *conn {
	c := r.testJoin(t)
	c.uid = uid
	c.tags.Store(in.Intern(tags))
	return c
}

// TestWriteSendsEachMemberItsAudience: in one write of messages with expressions that name
// tags, expressions that must be evaluated, one that reads uid, untargeted messages and one the
// budgets left out for a tag set, every member gets exactly the messages its tags (and uid)
// satisfy, in order.
func TestWriteSendsEachMemberItsAudience(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1"}, nil, time.Now())
	in := tag.NewInterner()
	type member struct {
		rec  *pushRecorder
		c    *conn
		tags []string
	}
	var members []member
	for i := range 24 {
		tags := []string{"g:" + strconv.Itoa(i%6), "c:" + strconv.Itoa(i%3)}
		if i%4 == 0 {
			tags = append(tags, "role:teacher")
		}
		rec := &pushRecorder{}
		members = append(members, member{rec, r.joinTagged(in, rec, "u"+strconv.Itoa(i), tags...), tags})
	}
	exprs := []string{
		``,
		`"c:1" in tags`,
		`"g:2" in tags || "c:0" in tags`,
		`"c:2" in tags && "g:5" in tags`,
		`role == "teacher"`,
		``,
		`uid == "u7" || "g:4" in tags`,
		`("g:1" in tags or "g:3" in tags) || "nobody" in tags`,
		`not ("c:1" in tags)`,
		`"c:2" in tags`, // left out for the set of g:2, c:2 below
	}
	skipFor := in.Intern([]string{"g:2", "c:2"})
	var msgs []queued
	for i, src := range exprs {
		q := queued{m: &clientpb.Message{Id: strconv.Itoa(i), Lane: clientpb.Lane_LANE_CRITICAL, TagExpr: src}}
		if i == len(exprs)-1 {
			q.skip = map[*tag.Set]struct{}{skipFor: {}}
		}
		msgs = append(msgs, q)
	}
	r.write(msgs, 0, 1)
	for i, m := range members {
		var want []string
		for j, src := range exprs {
			if j == len(exprs)-1 && m.c.tags.Load() == skipFor {
				continue
			}
			if src == "" {
				want = append(want, strconv.Itoa(j))
				continue
			}
			e, err := tag.Compile(src)
			if err != nil {
				t.Fatal(err)
			}
			if e.EvalTags(tag.Canonical(m.tags), m.c.uid) {
				want = append(want, strconv.Itoa(j))
			}
		}
		if got := m.rec.ids(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("member %d %v got %v, want %v", i, m.tags, got, want)
		}
	}
}

// TestWritesKeepTheirOwnAudiences: writes one after another, to the same tag sets with
// different messages, each work out their own audiences (the maps they reuse start empty).
func TestWritesKeepTheirOwnAudiences(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1"}, nil, time.Now())
	in := tag.NewInterner()
	one, two := &pushRecorder{}, &pushRecorder{}
	r.joinTagged(in, one, "u1", "c:1")
	r.joinTagged(in, two, "u2", "c:2")
	var wantOne, wantTwo []string
	for i := range 20 {
		id := strconv.Itoa(i)
		target := `"c:1" in tags`
		if i%2 == 1 {
			target = `"c:2" in tags`
			wantTwo = append(wantTwo, id)
		} else {
			wantOne = append(wantOne, id)
		}
		r.write([]queued{{m: &clientpb.Message{Id: id, Lane: clientpb.Lane_LANE_CRITICAL, TagExpr: target}}}, 0, 1)
	}
	if got := fmt.Sprint(one.ids()); got != fmt.Sprint(wantOne) {
		t.Errorf("the c:1 member got %s, want %v", got, wantOne)
	}
	if got := fmt.Sprint(two.ids()); got != fmt.Sprint(wantTwo) {
		t.Errorf("the c:2 member got %s, want %v", got, wantTwo)
	}
}

// BenchmarkRoomWriteTargeted is BenchmarkRoomWrite for the targeted fan-out bench's shape: a write
// of 25 messages, each for one or two classes and a group (internal/tools/loadgen/tags.go), to 625
// members in 500 groups, without the socket.
func BenchmarkRoomWriteTargeted(b *testing.B) {
	r := testRoom(Config{Node: "n1"}, nil, time.Now())
	in := tag.NewInterner()
	const members, groups = 625, 500
	for i := range members {
		g := i % groups
		r.joinTagged(in, &nullTransport{}, "u", "g:"+strconv.Itoa(g), "c:"+strconv.Itoa(g%10))
	}
	var tick []queued
	for i := range 25 {
		src := fmt.Sprintf(`"c:%d" in tags`, i%10)
		if i%2 == 1 {
			src = fmt.Sprintf(`"c:%d" in tags || "c:%d" in tags || "g:%d" in tags`, i%10, (i+3)%10, i*7919%groups)
		}
		tick = append(tick, queued{m: &clientpb.Message{Id: strconv.Itoa(i), Lane: clientpb.Lane_LANE_CRITICAL, Body: make([]byte, 64), TagExpr: src}})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r.write(tick, 0, 1)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*members), "ns/member")
}
