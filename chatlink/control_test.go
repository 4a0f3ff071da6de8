package chatlink

import (
	"fmt"
	"testing"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// countRoom returns a node holding one room, app/room, of members: member i has the tags
// class:<i%classes> and role:student (role:assistant for one in 50) and uid u<i>.
func countRoom(members, classes int) *Node {
	n := &Node{cfg: testConfig(Config{Node: "n1"})}
	n.exprs = tag.NewCache(n.cfg.ExprCacheSize)
	n.rooms = newRoomTable(n)
	r := &localRoom{t: n.rooms}
	n.rooms.shard("app/room").rooms["app/room"] = r
	tags := tag.NewInterner()
	for i := range members {
		role := "role:student"
		if i%50 == 0 {
			role = "role:assistant"
		}
		c := &conn{node: n, uid: fmt.Sprint("u", i)}
		c.tags.Store(tags.Intern([]string{fmt.Sprint("class:", i%classes), role}))
		r.mu.Lock()
		r.add(c)
		r.mu.Unlock()
	}
	return n
}

// TestCountTags: counts per expression and per tag over a room's tag sets agree with counting
// member by member.
func TestCountTags(t *testing.T) {
	t.Parallel()
	n := countRoom(1000, 10)
	var rep buspb.NodeControlReply
	n.countTags(&buspb.NodeControl{App: "app", Room: "room", TagPrefix: "class:", TagExprs: []string{
		`"class:3" in tags`, `role == "assistant"`, `uid endsWith "7"`, `"class:3" in tags && role == "student"`,
	}}, &rep)
	// Class 3 is members 3, 13, ... (100); assistants are 0, 50, ... (20, all in even classes);
	// uids ending in 7 are 100; class 3 holds no assistant.
	if rep.Affected != 1000 || fmt.Sprint(rep.ExprCounts) != "[100 20 100 100]" || len(rep.TagCounts) != 10 || rep.TagCounts["class:3"] != 100 || rep.More {
		t.Fatalf("counts: affected %d, by expression %v, by tag %v (more %v)", rep.Affected, rep.ExprCounts, rep.TagCounts, rep.More)
	}
	rep.Reset()
	n.countTags(&buspb.NodeControl{App: "app", Room: "room", TagExprs: []string{`len(tags) > 0`}}, &rep)
	if rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR) {
		t.Fatalf("a bad expression answered %v", &rep)
	}
	rep.Reset()
	n.countTags(&buspb.NodeControl{App: "app", Room: "elsewhere", TagExprs: []string{`true`}, TagPrefix: "class:"}, &rep)
	if rep.Affected != 0 || fmt.Sprint(rep.ExprCounts) != "[0]" || len(rep.TagCounts) != 0 {
		t.Fatalf("a room the node does not hold: %v", &rep)
	}
}

// BenchmarkCountTags: what one OP_COUNT_TAGS costs a node holding 20,000 members of a room in
// 1,000 tag sets (500 classes, two roles), for three expressions over tags and a prefix; and
// for one expression that reads uid, which is evaluated per member. cpu-ns/op is the process's
// CPU time per count (garbage collection included), which survives a shared machine.
func BenchmarkCountTags(b *testing.B) {
	n := countRoom(20_000, 500)
	for _, bc := range []struct {
		name string
		req  *buspb.NodeControl
	}{
		{"tags", &buspb.NodeControl{App: "app", Room: "room", TagPrefix: "class:", TagExprs: []string{
			`"class:3" in tags`, `role == "assistant"`, `"class:1" in tags || "class:2" in tags`,
		}}},
		{"uid", &buspb.NodeControl{App: "app", Room: "room", TagExprs: []string{`uid startsWith "u1"`}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			before := testkit.ProcessCPU()
			for b.Loop() {
				var rep buspb.NodeControlReply
				n.countTags(bc.req, &rep)
			}
			b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
