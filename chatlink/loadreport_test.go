package chatlink

import (
	"fmt"
	"testing"

	"roomcast/tag"
)

// The load report lists a node's biggest rooms, most members first, and says when it left
// rooms out; empty rooms are not listed.
func TestLoadReportBiggestRooms(t *testing.T) {
	t.Parallel()
	rt := newRoomTable(nil)
	add := func(key string, members int) {
		r := &localRoom{t: rt}
		r.slots[0] = make(map[*conn]*tag.Set)
		for range members {
			r.slots[0][&conn{}] = nil
		}
		rt.shard(key).rooms[key] = r
	}
	add("a/r1", 5)
	add("a/r2", 1)
	add("b/r3", 3)
	add("a/r4", 3)
	add("a/empty", 0)
	show := func(limit int) (string, bool) {
		got, partial := rt.biggest(limit)
		s := ""
		for _, rc := range got {
			s += fmt.Sprintf("%s/%s:%d ", rc.App, rc.Room, rc.Members)
		}
		return s, partial
	}
	if got, partial := show(3); got != "a/r1:5 a/r4:3 b/r3:3 " || !partial {
		t.Fatalf("biggest 3: %q partial %v, want a/r1:5 a/r4:3 b/r3:3, partial", got, partial)
	}
	if got, partial := show(10); got != "a/r1:5 a/r4:3 b/r3:3 a/r2:1 " || partial {
		t.Fatalf("biggest 10: %q partial %v, want all four rooms with members, complete", got, partial)
	}
}

// BenchmarkLoadReportBiggestRooms100k is the load report's room list on a node with 100,000
// rooms of 1 to 100 members: what each report costs the node.
func BenchmarkLoadReportBiggestRooms100k(b *testing.B) {
	rt := newRoomTable(nil)
	c := &conn{}
	for i := range 100_000 {
		key := fmt.Sprintf("demo/r%d", i)
		r := &localRoom{t: rt}
		r.slots[0] = map[*conn]*tag.Set{c: nil}
		for j := range i % 100 {
			r.slots[1+j%(phaseSlots-1)] = map[*conn]*tag.Set{c: nil}
		}
		rt.shard(key).rooms[key] = r
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, partial := rt.biggest(maxHeldRooms); len(got) != maxHeldRooms || !partial {
			b.Fatal(len(got), partial)
		}
	}
}
