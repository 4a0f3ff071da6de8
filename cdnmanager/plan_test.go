package cdnmanager

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// planner is a manager without a bus: what planLocked decides from its inputs.
func planner(now time.Time) *Manager {
	cfg, err := Config{Bus: &nats.Conn{}, Now: func() time.Time { return now }}.withDefaults()
	if err != nil {
		panic(err)
	}
	m := &Manager{
		cfg: cfg, windowMs: 1000, pushers: map[string]pusherState{}, nodes: map[string]*nodeState{},
		policies: map[string]*apipb.CdnPolicy{}, pins: map[roomKey]*apipb.RoomCdn{}, routes: map[roomKey]*buspb.CdnRoute{},
		ruleHeld: map[roomKey]time.Time{}, started: now.Add(-time.Hour),
		vendors: []*clientpb.CdnVendor{{UrlTemplate: "http://cdn.example/{app}/{room}/{window_ms}/{index}", Weight: 1}},
	}
	return m
}

// apply records a plan's routes as the KV watch would.
func (m *Manager) applyPlan(plan []change) {
	for _, c := range plan {
		if c.route == nil {
			delete(m.routes, c.key)
		} else {
			m.routes[c.key] = c.route
		}
	}
}

func (m *Manager) byPusher() map[string]int {
	n := map[string]int{}
	for _, r := range m.routes {
		n[r.Pusher]++
	}
	return n
}

func TestPlan(t *testing.T) {
	now := time.UnixMilli(1_000_000_500)
	const cur = 1_000_000
	m := planner(now)
	m.pushers["p1"] = pusherState{seen: now, windowMs: 1000}
	for i := range 6 {
		m.pins[roomKey{"a", fmt.Sprint("r", i)}] = &apipb.RoomCdn{PinnedMode: clientpb.CdnMode_CDN_MODE_BULK}
	}

	plan := m.planLocked(now, cur)
	if len(plan) != 6 || plan[0].reason != reasonNew || plan[0].announce.GetMode() != clientpb.CdnMode_CDN_MODE_BULK || plan[0].route.FromIndex != cur {
		t.Fatalf("six new rooms: %+v", plan)
	}
	m.applyPlan(plan)

	// A second and a third pusher come: rooms move to them, two windows ahead, announced to
	// nobody (the members' config does not change).
	m.pushers["p2"] = pusherState{seen: now, windowMs: 1000}
	m.pushers["p3"] = pusherState{seen: now, windowMs: 1000}
	plan = m.planLocked(now, cur)
	for _, c := range plan {
		if c.reason != reasonRebalance || c.route.PrevPusher != "p1" || c.route.FromIndex != cur+handoffWindows || c.announce != nil {
			t.Errorf("rebalance: %+v", c)
		}
	}
	m.applyPlan(plan)
	if n := m.byPusher(); n["p1"] != 2 || n["p2"] != 2 || n["p3"] != 2 {
		t.Fatalf("after the rebalance: %v", n)
	}
	// Rooms in a handoff do not move again; a balanced plan is empty.
	if plan = m.planLocked(now, cur); len(plan) != 0 {
		t.Fatalf("balanced: %+v", plan)
	}

	// p2 leaves: its rooms go to the others two windows ahead. p3 is lost: its rooms go from
	// the next window on.
	later := now.Add(time.Second)
	m.cfg.Now = func() time.Time { return later }
	m.pushers["p1"] = pusherState{seen: later, windowMs: 1000}
	m.pushers["p2"] = pusherState{seen: later, windowMs: 1000, leaving: true}
	plan = m.planLocked(later, cur+1)
	reasons := map[string]int{}
	for _, c := range plan {
		reasons[c.reason]++
		want := int64(cur + 1 + 1)
		if c.reason == reasonHandoff {
			want = cur + 1 + handoffWindows
		}
		if c.route.Pusher == "p2" || c.route.FromIndex != want {
			t.Errorf("%s: %+v", c.reason, c.route)
		}
	}
	if reasons[reasonHandoff] != 2 || reasons[reasonLost] != 0 {
		t.Errorf("p2 leaving: %v", reasons)
	}
	m.pushers["p3"] = pusherState{seen: now.Add(-m.cfg.PusherLease), windowMs: 1000}
	plan = m.planLocked(later, cur+1)
	reasons = map[string]int{}
	for _, c := range plan {
		reasons[c.reason]++
	}
	if reasons[reasonLost] != 2 {
		t.Errorf("p3 lost: %v", reasons)
	}

	// A pusher with another window gets no rooms; with no live pusher every room leaves CDN
	// mode and its members are told.
	m.applyPlan(plan)
	m.pushers = map[string]pusherState{"p9": {seen: later, windowMs: 500}}
	plan = m.planLocked(later, cur+1)
	if len(plan) != 6 {
		t.Fatalf("no live pusher: %d changes", len(plan))
	}
	for _, c := range plan {
		if c.route != nil || c.reason != reasonOff || c.announce.GetMode() != clientpb.CdnMode_CDN_MODE_OFF {
			t.Errorf("no live pusher: %+v", c)
		}
	}
}

// The rules hold a room in CDN mode while its count or its nodes' flow control is over the
// app's levels, and for RuleHold after; a pin overrides them.
func TestRules(t *testing.T) {
	now := time.UnixMilli(1_000_000_000)
	m := planner(now)
	m.policies["a"] = &apipb.CdnPolicy{OnlineThreshold: 100, FlowControlLevel: 0.7, RuleMode: clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK}
	m.nodes["n1"] = &nodeState{seen: now, loadSeen: now, strength: 0.2, rooms: map[roomKey]int64{{"a", "big"}: 60, {"a", "hot"}: 5, {"a", "calm"}: 5}}
	m.nodes["n2"] = &nodeState{seen: now, loadSeen: now, strength: 0.9, rooms: map[roomKey]int64{{"a", "big"}: 40, {"a", "hot"}: 1}}
	m.nodes["n1"].rooms[roomKey{"b", "big"}] = 100 // app b: the defaults, 10,000 and 0.5
	m.pins[roomKey{"a", "pinned"}] = &apipb.RoomCdn{PinnedMode: clientpb.CdnMode_CDN_MODE_OFF}
	m.nodes["n2"].rooms[roomKey{"a", "pinned"}] = 500
	m.watchRulesLocked(now)
	for k, want := range map[roomKey]clientpb.CdnMode{
		{"a", "big"}:    clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK, // 100 online
		{"a", "hot"}:    clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK, // on n2, flow control 0.9
		{"a", "calm"}:   clientpb.CdnMode_CDN_MODE_OFF,
		{"b", "big"}:    clientpb.CdnMode_CDN_MODE_OFF,
		{"a", "pinned"}: clientpb.CdnMode_CDN_MODE_OFF,
	} {
		if got, _ := m.desiredLocked(k); got != want {
			t.Errorf("%v: %v, want %v", k, got, want)
		}
	}
	// The crowd leaves: held for RuleHold, then off.
	report := func(at time.Time) {
		m.nodes = map[string]*nodeState{"n1": {seen: at, loadSeen: at, rooms: map[roomKey]int64{{"a", "big"}: 1}}}
		m.watchRulesLocked(at)
	}
	report(now.Add(m.cfg.RuleHold / 2))
	if got, _ := m.desiredLocked(roomKey{"a", "big"}); got != clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK {
		t.Errorf("within the hold: %v", got)
	}
	report(now.Add(m.cfg.RuleHold))
	if got, _ := m.desiredLocked(roomKey{"a", "big"}); got != clientpb.CdnMode_CDN_MODE_OFF {
		t.Errorf("after the hold: %v", got)
	}
}

// A room leaving CDN mode keeps its pusher up to two windows ahead, its members told at once of
// the last segment to poll; its route goes once that window has passed. Asked for again before
// the end, it stays; its pusher lost meanwhile, the route goes at once.
func TestPlanOff(t *testing.T) {
	now := time.UnixMilli(1_000_000_500)
	const cur = 1_000_000
	m := planner(now)
	m.pushers["p1"] = pusherState{seen: now, windowMs: 1000}
	k := roomKey{"a", "r"}
	m.pins[k] = &apipb.RoomCdn{PinnedMode: clientpb.CdnMode_CDN_MODE_BULK}
	m.applyPlan(m.planLocked(now, cur))
	on := m.routes[k]

	m.pins[k] = &apipb.RoomCdn{PinnedMode: clientpb.CdnMode_CDN_MODE_OFF}
	plan := m.planLocked(now, cur)
	if len(plan) != 1 || plan[0].reason != reasonOff || plan[0].route == nil {
		t.Fatalf("off: %+v", plan)
	}
	r, off := plan[0].route, plan[0].announce
	if r.Pusher != "p1" || r.Mode != clientpb.CdnMode_CDN_MODE_BULK || r.UntilIndex != cur+handoffWindows {
		t.Errorf("ending route: %v", r)
	}
	if off.Mode != clientpb.CdnMode_CDN_MODE_OFF || off.LastIndex != cur+handoffWindows-1 || off.WindowMs != 1000 ||
		len(off.Vendors) != 1 || !proto.Equal(r.Config, off) {
		t.Errorf("members told %v", off)
	}
	m.applyPlan(plan)
	for _, at := range []int64{cur, cur + 1, cur + handoffWindows} {
		if plan := m.planLocked(now, at); len(plan) != 0 {
			t.Errorf("window %d: %+v", at, plan)
		}
	}
	plan = m.planLocked(now, cur+handoffWindows+1)
	if len(plan) != 1 || plan[0].route != nil || plan[0].announce != nil {
		t.Errorf("after the end: %+v", plan)
	}

	// Back on in the window it went off in: kept, members told.
	m.pins[k] = &apipb.RoomCdn{PinnedMode: clientpb.CdnMode_CDN_MODE_BULK}
	m.routes[k] = r
	plan = m.planLocked(now, cur)
	if len(plan) != 1 || plan[0].route.GetUntilIndex() != 0 || plan[0].route.Pusher != "p1" ||
		plan[0].route.FromIndex != on.FromIndex || plan[0].announce.GetMode() != clientpb.CdnMode_CDN_MODE_BULK {
		t.Errorf("back on: %+v", plan)
	}
	// Back on a window later: too late for everyone to read it before the end; it ends first.
	if plan = m.planLocked(now, cur+1); len(plan) != 0 {
		t.Errorf("back on late: %+v", plan)
	}

	// The pusher lost while the room ends: the route goes at once.
	m.pushers["p1"] = pusherState{seen: now.Add(-2 * m.cfg.PusherLease), windowMs: 1000}
	m.pushers["p2"] = pusherState{seen: now, windowMs: 1000}
	plan = m.planLocked(now, cur+1)
	if len(plan) != 1 || plan[0].route != nil {
		t.Errorf("pusher lost while ending: %+v", plan)
	}
}
