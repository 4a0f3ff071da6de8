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
