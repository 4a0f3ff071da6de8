package dispatcher

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"roomcast/internal/buspb"
)

// spread checks that got (members per node) uses exactly want nodes, the busiest at most 1.2
// times the least.
func spread(t *testing.T, what string, got map[string]int64, want int) {
	t.Helper()
	counts := slices.Collect(maps.Values(got))
	if len(counts) != want {
		t.Fatalf("%s: on %d nodes %v, want %d", what, len(counts), got, want)
	}
	if hi, lo := slices.Max(counts), slices.Min(counts); float64(hi) > 1.2*float64(lo) {
		t.Fatalf("%s: busiest %d > 1.2 x least %d: %v", what, hi, lo, got)
	}
}

// A 4,000-member room over four nodes of 4,000 connections: with RoomShare 0.5 a node takes
// 2,000 of the room, so the room needs two nodes, and gets two, full to their limit, whether
// the crowd arrives between two reports or while the nodes report what they hold.
func TestRoomFillsFewestNodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   Config
		every int // members between two rounds of reports; 0: none (a flash crowd)
	}{
		{"flash crowd", Config{}, 0},
		{"flash crowd uncached", Config{CacheTTL: -1}, 0},
		{"with reports", Config{}, 250},
		{"strict order", Config{NearEqual: -1}, 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, clock := newTest(t, tc.cfg)
			conns := map[string]int64{}
			reportAll := func() {
				for i := range 4 {
					name := fmt.Sprintf("n%d", i)
					r := nodeReport(name, "", "", conns[name], 4000)
					if conns[name] > 0 {
						r.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "big", Members: conns[name]}}
					}
					report(d, r)
				}
			}
			reportAll()
			for i := range 4000 {
				if tc.every > 0 && i > 0 && i%tc.every == 0 {
					clock.Add(100 * time.Millisecond)
					reportAll()
				}
				ans, err := d.Dispatch(Request{App: "demo", Room: "big"})
				if err != nil {
					t.Fatal(err)
				}
				conns[ans.Nodes[0].Node]++
				if len(ans.Nodes) != 3 {
					t.Fatalf("answer %v: want TopK = 3 nodes", names(ans))
				}
			}
			spread(t, "members", conns, 2)
			for _, c := range conns {
				if c != 2000 {
					t.Fatalf("members %v: want 2,000 on each node used", conns)
				}
			}
			if tc.every == 0 {
				// The dispatcher's own counts say the same before any report.
				got := d.rooms.held(roomKey{"demo", "big"})
				if !maps.Equal(got, conns) {
					t.Fatalf("room table %v, want %v", got, conns)
				}
			}
			if j, o := counterValue(d.m.roomDecisions[roomJoined]), counterValue(d.m.roomDecisions[roomOpened]); j != 3998 || o != 2 {
				t.Fatalf("room decisions: joined %v opened %v, want 3998 and 2", j, o)
			}
		})
	}
}

// Without room affinity the same room spreads over every node: the test above relies on it.
func TestRoomShareNegativeSpreads(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{RoomShare: -1})
	for i := range 4 {
		report(d, nodeReport(fmt.Sprintf("n%d", i), "", "", 0, 4000))
	}
	got := firstChoices(t, d, Request{App: "demo", Room: "big"}, 4000)
	if len(got) != 4 {
		t.Fatalf("without room affinity: %v, want all four nodes", got)
	}
}

// A flash crowd of many rooms still spreads over the fleet: each room stays on one node, and
// the rooms fill the nodes evenly.
func TestRoomsFlashCrowdSpreads(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	for i := range 4 {
		report(d, nodeReport(fmt.Sprintf("n%d", i), "", "", 0, 4000))
	}
	const rooms, size = 1000, 8
	order := make([]int, 0, rooms*size)
	for r := range rooms {
		for range size {
			order = append(order, r)
		}
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	perNode := map[string]int64{}
	roomNodes := map[int]map[string]bool{}
	for _, r := range order {
		ans, err := d.Dispatch(Request{App: "demo", Room: fmt.Sprintf("r%d", r)})
		if err != nil {
			t.Fatal(err)
		}
		n := ans.Nodes[0].Node
		perNode[n]++
		if roomNodes[r] == nil {
			roomNodes[r] = map[string]bool{}
		}
		roomNodes[r][n] = true
	}
	for r, nodes := range roomNodes {
		if len(nodes) != 1 {
			t.Fatalf("room r%d on %d nodes %v, want one", r, len(nodes), nodes)
		}
	}
	spread(t, "clients", perNode, 4)
}

// Locality ranks above room affinity: a client goes to a node of its own province that does
// not hold the room rather than to one in another province that does; within its province, to
// the node holding the room, though another is emptier.
func TestRoomAffinityBelowLocality(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	d, _ := newTest(t, Config{CityDB: city, ISPDB: isp})
	bj := nodeReport("bj", "AS/CN/11", "unicom", 100, 10_000)
	bj.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "r", Members: 100}}
	report(d, bj)
	report(d, nodeReport("jl-empty", "AS/CN/22", "unicom", 0, 10_000))
	jilin := netip.MustParseAddr("175.16.199.9")
	if got := firstChoices(t, d, Request{Client: jilin, App: "demo", Room: "r"}, 5); got["jl-empty"] != 5 {
		t.Fatalf("Jilin client of a room held in Beijing: %v, want its own province (jl-empty)", got)
	}
	// jl-empty holds the room now (the dispatcher sent it five); a busier Jilin node does not.
	report(d, nodeReport("jl-busy", "AS/CN/22", "unicom", 3000, 10_000))
	if got := firstChoices(t, d, Request{Client: jilin, App: "demo", Room: "r"}, 20); got["jl-empty"] != 20 {
		t.Fatalf("Jilin clients: %v, want the Jilin node holding the room", got)
	}
	// Another room is dispatched on load: the emptier node.
	if got := firstChoices(t, d, Request{Client: jilin, App: "demo", Room: "other"}, 1); got["jl-busy"] != 0 {
		t.Fatalf("a new room: %v, want the emptier node", got)
	}
	// Beijing's client joins the Beijing holder.
	if got := firstChoices(t, d, Request{Client: netip.MustParseAddr("123.112.4.5"), App: "demo", Room: "r"}, 3); got["bj"] != 3 {
		t.Fatalf("Beijing clients: %v, want bj", got)
	}
}

// A room's holders are classed by locality through the client's ranking, by node slot. A node
// that is out gives its slot to the next new one; a ranking built before then, still served
// while another decision rebuilds it, must class the newcomer by its own labels, not by those
// of the node whose slot it took.
func TestRoomHolderClassAfterSlotReuse(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	d, clock := newTest(t, Config{CityDB: city, ISPDB: isp, StaleAfter: time.Second})
	report(d, nodeReport("jl", "AS/CN/22", "unicom", 0, 10_000))
	report(d, nodeReport("bj", "AS/CN/11", "unicom", 0, 10_000))
	report(d, nodeReport("tokyo", "AS/JP/13", "", 0, 10_000))
	jilin := netip.MustParseAddr("175.16.199.9")
	firstChoices(t, d, Request{Client: jilin, App: "demo", Room: "warm"}, 1) // caches Jilin's ranking

	// tokyo goes out; a Jilin node holding room r takes its slot.
	clock.Add(2 * time.Second)
	report(d, nodeReport("jl", "AS/CN/22", "unicom", 1, 10_000))
	report(d, nodeReport("bj", "AS/CN/11", "unicom", 0, 10_000))
	d.sweep(d.now())
	held := nodeReport("jl-room", "AS/CN/22", "unicom", 100, 10_000)
	held.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "r", Members: 100}}
	tokyoSlot := d.slots.Load() - 1
	report(d, held)
	d.mu.Lock()
	slot := d.nodes["jl-room"].slot
	d.mu.Unlock()
	if slot != tokyoSlot {
		t.Fatalf("jl-room has slot %d, want tokyo's %d", slot, tokyoSlot)
	}
	// Another decision is rebuilding Jilin's ranking: this one is served the old ranking.
	for i := range d.cache.shards {
		for _, r := range d.cache.shards[i].m {
			r.rebuilding.Store(true)
		}
	}
	if got := firstChoices(t, d, Request{Client: jilin, App: "demo", Room: "r"}, 1); got["jl-room"] != 1 {
		t.Fatalf("Jilin client of a room held in Jilin, on an old ranking: %v, want jl-room", got)
	}
	if hits := counterValue(d.m.cacheHit); hits != 1 {
		t.Fatalf("cache hits %v, want 1: the old ranking served", hits)
	}
}

// A room's limit on a node follows its slow start, and a full node takes no more of the room
// whatever it holds; the room's members then open the next node.
func TestRoomLimitFollowsSlowStart(t *testing.T) {
	t.Parallel()
	d, clock := newTest(t, Config{StaleAfter: time.Hour})
	clock.Add(2 * time.Hour) // past the start-up grace: new nodes warm up
	report(d, nodeReport("a", "", "", 0, 10_000))
	// At the start of slow start a may fill 5% of its capacity, 500, and the room half of it;
	// with no other node the room then grows past its limit on a (overflow).
	firstChoices(t, d, Request{App: "demo", Room: "r"}, 300)
	if got := d.rooms.held(roomKey{"demo", "r"}); got["a"] != 300 {
		t.Fatalf("one warming node: %v", got)
	}
	if j, o := counterValue(d.m.roomDecisions[roomJoined]), counterValue(d.m.roomDecisions[roomOverflow]); j != 249 || o != 50 {
		t.Fatalf("one warming node: joined %v overflow %v, want 249 (up to the limit) and 50", j, o)
	}
	report(d, nodeReport("b", "", "", 0, 10_000))
	// b is warming too: the room opens b and fills it up to its limit there, 250.
	got := firstChoices(t, d, Request{App: "demo", Room: "r"}, 250)
	if got["b"] != 250 {
		t.Fatalf("second node: %v, want 250 on b", got)
	}
	// Half the slow start later the room's limit is 0.5 x 52.5% x 10,000 = 2,625 on either:
	// the fuller node, a, fills up to it first.
	clock.Add(15 * time.Second)
	got = firstChoices(t, d, Request{App: "demo", Room: "r"}, 2500)
	if got["a"] != 2325 || got["b"] != 175 {
		t.Fatalf("half way through slow start: %v, want a up to 2,625, then b", got)
	}
}

// Room counts follow the reports: a room a node no longer lists (its members left) stops
// steering members there, a room a node lists steers members there from the first report, and
// a node that is out takes its rooms with it.
func TestRoomTableFollowsReports(t *testing.T) {
	t.Parallel()
	d, clock := newTest(t, Config{StaleAfter: time.Second})
	a := nodeReport("a", "", "", 500, 10_000)
	a.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "r", Members: 500}}
	report(d, a)
	report(d, nodeReport("b", "", "", 0, 10_000))
	if got := firstChoices(t, d, Request{App: "demo", Room: "r"}, 10); got["a"] != 10 {
		t.Fatalf("room held by a: %v", got)
	}
	if got := d.rooms.held(roomKey{"demo", "r"}); got["a"] != 510 {
		t.Fatalf("room table %v, want a: 510", got)
	}
	// a's members left: its next report does not list the room. The ten the dispatcher sent
	// may still be on their way: they count for one more report.
	report(d, nodeReport("a", "", "", 0, 10_000))
	if got := d.rooms.held(roomKey{"demo", "r"}); len(got) != 1 || got["a"] != 10 {
		t.Fatalf("room table after a report without the room: %v, want a: 10 (on their way)", got)
	}
	report(d, nodeReport("a", "", "", 0, 10_000))
	if got := d.rooms.held(roomKey{"demo", "r"}); len(got) != 0 {
		t.Fatalf("room table after two reports without the room: %v, want empty", got)
	}
	b := nodeReport("b", "", "", 2000, 10_000)
	b.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "r", Members: 2000}}
	report(d, b)
	if got := firstChoices(t, d, Request{App: "demo", Room: "r"}, 10); got["b"] != 10 {
		t.Fatalf("room now held by b: %v", got)
	}
	// b goes silent: a alone reports on, and b's rooms go with it.
	for range 3 {
		clock.Add(time.Second)
		report(d, nodeReport("a", "", "", 0, 10_000))
	}
	d.sweep(d.now())
	if got := d.rooms.held(roomKey{"demo", "r"}); len(got) != 0 {
		t.Fatalf("room table after b is out: %v, want empty", got)
	}
	for i := range d.rooms.shards {
		if n := len(d.rooms.shards[i].m); n != 0 {
			t.Fatalf("shard %d keeps %d rooms of nodes that are gone", i, n)
		}
	}
}

func TestRoomRequestChecked(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	report(d, nodeReport("a", "", "", 0, 100))
	for _, req := range []Request{{App: "demo"}, {Room: "r"}, {App: "demo", Room: "a.b"}, {App: "de mo", Room: "r"}} {
		if _, err := d.Dispatch(req); err == nil {
			t.Errorf("%+v: no error", req)
		}
	}
	if _, err := d.Dispatch(Request{}); err != nil {
		t.Fatalf("no room: %v", err)
	}
}

func TestRoomReportsChecked(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	for _, rooms := range [][]*buspb.RoomCount{
		{{App: "demo", Room: "a.b", Members: 1}},
		{{App: "demo", Room: "r", Members: -1}},
		make([]*buspb.RoomCount, maxRoomsHeld+1),
	} {
		r := nodeReport("a", "", "", 0, 100)
		r.RoomsHeld = rooms
		report(d, r)
	}
	if n := d.LiveNodes(); n != 0 {
		t.Fatalf("%d nodes from reports with bad rooms, want none", n)
	}
}
