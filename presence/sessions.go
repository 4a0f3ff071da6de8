package presence

import (
	"strconv"
	"strings"

	"roomcast/internal/buspb"
	"roomcast/internal/ids"
)

// sessionTable is an instance's replica of every session of every node, kept small: every
// instance holds all of them (docs/scale.md#the-services-memory-per-session). A session is one
// fixed-size record in a slice; its app, room, node and device are numbers into a table of
// names shared by all sessions (a big room's name is kept once, not once a member); its id
// "<node>-<n>" (ids.SessionID) is kept as the number n beside the node's; and its user's
// sessions are a chain through the records, reached from one map entry per user. The
// login's SessionEvent itself is not kept: queries and logouts rebuild it from the record.
type sessionTable struct {
	names interner
	recs  []session
	free  []int32 // slots of recs that are free
	byID  map[uint64]int32
	// odd holds what does not fit a record's numbers: sessions whose id is not
	// "<node>-<n>" in base 36 with a small n, or whose login names another node than the
	// stream it came on (never from a ChatLink; tests name sessions freely).
	odd    map[oddKey]int32
	oddOf  map[int32]oddSession
	perApp map[uint32]*appSessions
	total  int64
}

// session is one session's record, 48 bytes. A free slot has node 0.
type session struct {
	uid    string // shared by a user's sessions
	timeMs int64
	// seq is n of the id "<node>-<n>"; 0 for an odd session (oddOf).
	seq uint32
	// node is the node whose stream the login came on, which the login names too.
	node   uint32
	app    uint32
	room   uint32
	device uint32
	// nextOfUser is the slot of the user's next session, or -1.
	nextOfUser int32
}

// idKey is the key of byID: a session's node number and n, which both fit (see add).
func idKey(node, seq uint32) uint64 { return uint64(node)<<32 | uint64(seq) }

type oddKey struct {
	node uint32
	id   string
}

// oddSession is an odd session's id, and the node its login names.
type oddSession struct{ id, node string }

// appSessions is an app's sessions and users: users maps a uid to its first session.
type appSessions struct {
	sessions int64
	users    map[string]int32
}

func newSessionTable() *sessionTable {
	return &sessionTable{
		names: newInterner(), byID: make(map[uint64]int32),
		odd: make(map[oddKey]int32), oddOf: make(map[int32]oddSession), perApp: make(map[uint32]*appSessions),
	}
}

// parseSessionID returns n of an id "<node>-<n>" written as ids.SessionID writes it, when n
// fits a record.
func parseSessionID(node, id string) (uint32, bool) {
	rest, ok := strings.CutPrefix(id, node)
	if !ok || len(rest) < 2 || rest[0] != '-' {
		return 0, false
	}
	n, err := strconv.ParseUint(rest[1:], 36, 32)
	if err != nil || n == 0 || strconv.FormatUint(n, 36) != rest[1:] {
		return 0, false
	}
	return uint32(n), true
}

// slot returns the slot of session id on the stream of the node numbered view, named
// viewName, or -1.
func (t *sessionTable) slot(view uint32, viewName, id string) int32 {
	if n, ok := parseSessionID(viewName, id); ok {
		if i, ok := t.byID[idKey(view, n)]; ok {
			return i
		}
		// An odd session may look like a ChatLink's when its login named another node.
	}
	if i, ok := t.odd[oddKey{view, id}]; ok {
		return i
	}
	return -1
}

// add records a login that came on the stream of the node numbered view, named viewName,
// unless its session is known. It reports whether it was new.
func (t *sessionTable) add(view uint32, viewName string, ev *buspb.SessionEvent) bool {
	if t.slot(view, viewName, ev.SessionId) >= 0 {
		return false
	}
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		t.recs = append(t.recs, session{})
		i = int32(len(t.recs) - 1)
	}
	app := t.names.acquire(ev.App)
	r := session{
		timeMs: ev.TimeMs, node: t.names.hold(view), app: app, room: t.names.acquire(ev.Room),
		device: t.names.acquire(ev.Device), nextOfUser: -1,
	}
	if n, ok := parseSessionID(viewName, ev.SessionId); ok && viewName == ev.Node {
		r.seq = n
		t.byID[idKey(view, n)] = i
	} else {
		id := strings.Clone(ev.SessionId)
		t.odd[oddKey{view, id}] = i
		t.oddOf[i] = oddSession{id: id, node: strings.Clone(ev.Node)}
	}
	a := t.perApp[app]
	if a == nil {
		a = &appSessions{users: make(map[string]int32)}
		t.perApp[app] = a
	}
	if first, ok := a.users[ev.Uid]; ok {
		r.uid = t.recs[first].uid // one copy of the uid a user
		r.nextOfUser = first
	} else {
		r.uid = strings.Clone(ev.Uid) // not the batch's allocation
	}
	a.users[r.uid] = i
	t.recs[i] = r
	a.sessions++
	t.total++
	return true
}

// remove forgets session id of the stream of the node numbered view, named viewName, and
// returns its login, or nil.
func (t *sessionTable) remove(view uint32, viewName, id string) *buspb.SessionEvent {
	i := t.slot(view, viewName, id)
	if i < 0 {
		return nil
	}
	ev := t.event(i)
	t.removeSlot(i)
	return ev
}

func (t *sessionTable) removeSlot(i int32) {
	r := t.recs[i]
	if r.seq != 0 {
		delete(t.byID, idKey(r.node, r.seq))
	} else {
		delete(t.odd, oddKey{r.node, t.oddOf[i].id})
		delete(t.oddOf, i)
	}
	a := t.perApp[r.app]
	if first := a.users[r.uid]; first == i {
		if r.nextOfUser < 0 {
			delete(a.users, r.uid)
		} else {
			a.users[r.uid] = r.nextOfUser
		}
	} else {
		for j := first; j >= 0; j = t.recs[j].nextOfUser {
			if t.recs[j].nextOfUser == i {
				t.recs[j].nextOfUser = r.nextOfUser
				break
			}
		}
	}
	a.sessions--
	if a.sessions == 0 {
		delete(t.perApp, r.app)
	}
	t.total--
	t.names.release(r.app)
	t.names.release(r.room)
	t.names.release(r.node)
	t.names.release(r.device)
	t.recs[i] = session{}
	t.free = append(t.free, i)
}

// removeNode forgets every session that came on the stream of the node numbered view and
// returns their logins.
func (t *sessionTable) removeNode(view uint32) []*buspb.SessionEvent {
	var out []*buspb.SessionEvent
	for i := range t.recs {
		if t.recs[i].node == view {
			out = append(out, t.event(int32(i)))
			t.removeSlot(int32(i))
		}
	}
	return out
}

// event rebuilds the login of the session in slot i.
func (t *sessionTable) event(i int32) *buspb.SessionEvent {
	r := &t.recs[i]
	node, id := t.names.name(r.node), ""
	if r.seq != 0 {
		id = ids.SessionID(node, uint64(r.seq))
	} else {
		odd := t.oddOf[i]
		node, id = odd.node, odd.id
	}
	return &buspb.SessionEvent{
		Kind: buspb.SessionEvent_KIND_LOGIN, App: t.names.name(r.app), Uid: r.uid, Room: t.names.name(r.room),
		Node: node, SessionId: id, Device: t.names.name(r.device), TimeMs: r.timeMs,
	}
}

// user returns the logins of a user's sessions, in no order.
func (t *sessionTable) user(app, uid string) []*buspb.SessionEvent {
	a, ok := t.names.lookup(app)
	if !ok || t.perApp[a] == nil {
		return nil
	}
	first, ok := t.perApp[a].users[uid]
	if !ok {
		return nil
	}
	var out []*buspb.SessionEvent
	for i := first; i >= 0; i = t.recs[i].nextOfUser {
		out = append(out, t.event(i))
	}
	return out
}

// count returns the sessions and distinct users of an app.
func (t *sessionTable) count(app string) (sessions, users int64) {
	if a, ok := t.names.lookup(app); ok {
		if c := t.perApp[a]; c != nil {
			return c.sessions, int64(len(c.users))
		}
	}
	return 0, 0
}

// interner numbers the strings many sessions share (apps, rooms, nodes, devices) and counts
// their users, so a name no session uses any more is forgotten. Number 0 is never given.
type interner struct {
	ids   map[string]uint32
	names []string // by number
	refs  []int32  // by number
	free  []uint32
}

func newInterner() interner {
	return interner{ids: make(map[string]uint32), names: []string{""}, refs: []int32{0}}
}

// acquire returns s's number, counting one more user of it.
func (in *interner) acquire(s string) uint32 {
	if id, ok := in.ids[s]; ok {
		in.refs[id]++
		return id
	}
	s = strings.Clone(s)
	var id uint32
	if n := len(in.free); n > 0 {
		id, in.free = in.free[n-1], in.free[:n-1]
		in.names[id], in.refs[id] = s, 1
	} else {
		id = uint32(len(in.names))
		in.names, in.refs = append(in.names, s), append(in.refs, 1)
	}
	in.ids[s] = id
	return id
}

// hold counts one more user of id and returns it.
func (in *interner) hold(id uint32) uint32 {
	in.refs[id]++
	return id
}

// lookup returns s's number without counting a user.
func (in *interner) lookup(s string) (uint32, bool) {
	id, ok := in.ids[s]
	return id, ok
}

// release counts one user of id less, and forgets it after its last.
func (in *interner) release(id uint32) {
	if in.refs[id]--; in.refs[id] == 0 {
		delete(in.ids, in.names[id])
		in.names[id] = ""
		in.free = append(in.free, id)
	}
}

func (in *interner) name(id uint32) string { return in.names[id] }
