package presence

import (
	"slices"
	"testing"

	"roomcast/internal/buspb"
)

func login(app, uid, room, node, id, device string, ms int64) *buspb.SessionEvent {
	return &buspb.SessionEvent{Kind: buspb.SessionEvent_KIND_LOGIN, App: app, Uid: uid, Room: room, Node: node, SessionId: id, Device: device, TimeMs: ms}
}

func sessionIDs(evs []*buspb.SessionEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.SessionId)
	}
	slices.Sort(out)
	return out
}

// TestSessionTable checks the compact replica against what it replaced: logins come back as
// they went in (ChatLink ids and odd ones), per user and per app, and a node's removal or the
// last session's forgets every name it numbered.
func TestSessionTable(t *testing.T) {
	tb := newSessionTable()
	e1, e2 := tb.names.acquire("edge-1"), tb.names.acquire("edge-2")
	logins := []*buspb.SessionEvent{
		login("a", "u1", "r1", "edge-1", "edge-1-1", "web", 10),
		login("a", "u1", "r2", "edge-1", "edge-1-a", "ios", 20),
		login("a", "u2", "r1", "edge-1", "s-odd", "web", 30),       // not a ChatLink's id
		login("a", "u1", "r1", "edge-2", "edge-2-1", "web", 40),    // the same user on another node
		login("b", "u1", "r9", "edge-2", "edge-2-2", "android", 5), // another app's user u1
		login("a", "u3", "r1", "edge-9", "edge-2-3", "web", 50),    // names another node than its stream
		login("a", "u4", "r1", "edge-2", "edge-2-0100", "web", 60), // not canonical base 36
	}
	views := []uint32{e1, e1, e1, e2, e2, e2, e2}
	names := []string{"edge-1", "edge-1", "edge-1", "edge-2", "edge-2", "edge-2", "edge-2"}
	for i, ev := range logins {
		if !tb.add(views[i], names[i], ev) {
			t.Fatalf("login %s not new", ev.SessionId)
		}
	}
	if tb.add(e1, "edge-1", logins[0]) {
		t.Error("a known session was added again")
	}
	if s, u := tb.count("a"); s != 6 || u != 4 {
		t.Errorf("app a: %d sessions, %d users; want 6, 4", s, u)
	}
	if s, u := tb.count("b"); s != 1 || u != 1 {
		t.Errorf("app b: %d sessions, %d users; want 1, 1", s, u)
	}
	got := tb.user("a", "u1")
	if want := []string{"edge-1-1", "edge-1-a", "edge-2-1"}; !slices.Equal(sessionIDs(got), want) {
		t.Errorf("user a/u1: %v, want %v", sessionIDs(got), want)
	}
	for _, ev := range append(got, tb.user("a", "u3")...) {
		i := slices.IndexFunc(logins, func(l *buspb.SessionEvent) bool { return l.SessionId == ev.SessionId })
		if want := logins[i]; ev.App != want.App || ev.Uid != want.Uid || ev.Room != want.Room || ev.Node != want.Node ||
			ev.Device != want.Device || ev.TimeMs != want.TimeMs || ev.Kind != want.Kind {
			t.Errorf("rebuilt login %v, want %v", ev, want)
		}
	}

	if ev := tb.remove(e1, "edge-1", "edge-1-1"); ev == nil || ev.Room != "r1" || ev.Device != "web" {
		t.Errorf("removed %v, want the login of edge-1-1", ev)
	}
	if ev := tb.remove(e1, "edge-1", "edge-1-1"); ev != nil {
		t.Errorf("removed %v again", ev)
	}
	if ev := tb.remove(e2, "edge-2", "s-odd"); ev != nil {
		t.Errorf("removed edge-1's odd session %v from edge-2", ev)
	}
	if ev := tb.remove(e1, "edge-1", "s-odd"); ev == nil || ev.Uid != "u2" {
		t.Errorf("odd session: removed %v", ev)
	}
	if want := []string{"edge-1-a", "edge-2-1"}; !slices.Equal(sessionIDs(tb.user("a", "u1")), want) {
		t.Errorf("user a/u1 after a logout: %v, want %v", sessionIDs(tb.user("a", "u1")), want)
	}
	if s, u := tb.count("a"); s != 4 || u != 3 {
		t.Errorf("app a after logouts: %d sessions, %d users; want 4, 3", s, u)
	}

	dropped := tb.removeNode(e2)
	if want := []string{"edge-2-0100", "edge-2-1", "edge-2-2", "edge-2-3"}; !slices.Equal(sessionIDs(dropped), want) {
		t.Errorf("edge-2 dropped %v, want %v", sessionIDs(dropped), want)
	}
	if s, u := tb.count("b"); s != 0 || u != 0 || len(tb.perApp) != 1 {
		t.Errorf("app b after its node went: %d sessions, %d users, %d apps", s, u, len(tb.perApp))
	}
	tb.remove(e1, "edge-1", "edge-1-a")
	tb.names.release(e1)
	tb.names.release(e2)
	if tb.total != 0 || len(tb.byID) != 0 || len(tb.odd) != 0 || len(tb.oddOf) != 0 || len(tb.perApp) != 0 || len(tb.names.ids) != 0 {
		t.Errorf("empty table keeps %d sessions, %d ids, %d odd, %d apps, names %v",
			tb.total, len(tb.byID), len(tb.odd), len(tb.perApp), tb.names.ids)
	}
	// Freed slots and numbers are used again.
	n, numbers := len(tb.recs), len(tb.names.names)
	tb.add(tb.names.acquire("edge-3"), "edge-3", login("a", "u5", "r5", "edge-3", "edge-3-1", "web", 70))
	if len(tb.recs) != n || len(tb.names.names) != numbers {
		t.Errorf("slots %d (was %d), name numbers %d (were %d): freed ones not used again", len(tb.recs), n, len(tb.names.names), numbers)
	}
}

// TestSessionMemory holds the replica to its budget of 300 bytes of heap a session
// (docs/scale.md), with 50,000 sessions of one room over 14 nodes. The replica of logins kept
// as they arrived took 650.
func TestSessionMemory(t *testing.T) {
	per := sessionLoad{n: 50_000, nodes: 14}.heapPerSession(t)
	t.Logf("%.0f B a session", per)
	if per > 300 {
		t.Errorf("%.0f B of heap a session, want at most 300", per)
	}
}
