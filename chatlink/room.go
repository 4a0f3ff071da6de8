package chatlink

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/tag"
)

const roomShards = 64

// roomTable holds the rooms that have members on this node, sharded so that joins and leaves in
// different rooms do not contend.
type roomTable struct {
	n      *Node
	seed   maphash.Seed
	shards [roomShards]roomShard
}

type roomShard struct {
	// mu guards rooms, fresh and the membership changes of every room in this shard.
	// Lock order: roomShard.mu -> roomFanout.mu -> localRoom.mu.
	mu    sync.Mutex
	rooms map[string]*localRoom
	fresh map[string]bool // rooms whose fresh settings a login has asked for (claimFresh)
}

// localRoom is one room's members on this node, its broadcast subscription and its fan-out
// state (fanout.go).
type localRoom struct {
	t         *roomTable
	app, room string
	subject   string
	ready     chan struct{} // closed once the subscription is known to the NATS server

	// mu guards slots, nextSlot and sets. Lock order: localRoom.mu -> a member's writer (write
	// closes slow readers while it reads the room).
	mu       sync.RWMutex
	slots    [phaseSlots]map[*conn]*tag.Set // the members, by c.slot, with the tag set each is counted under in sets
	nextSlot uint8
	sets     map[*tag.Set]int // members by tag set: the audiences the budgets apply to (budget.go)
	sub      *nats.Subscription

	cdn atomic.Pointer[clientpb.CdnConfig] // the room's CDN config (cdn.go); nil or mode off: none

	counters    atomic.Pointer[clientpb.CounterTotals] // the room's counters as last broadcast (counters.go); nil: none known
	countersOut roomCounters

	viewers atomic.Pointer[clientpb.ViewerCount]    // the room's viewer count as last written (viewers.go); nil: none known
	attrs   atomic.Pointer[clientpb.RoomAttributes] // the room's attributes, the newest version heard (attributes.go); nil: none known
	recalls recentRecalls                           // the room's recalls of the last recentRecallAge (recall.go)

	fanout roomFanout
}

func newRoomTable(n *Node) *roomTable {
	t := &roomTable{n: n, seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].rooms = make(map[string]*localRoom)
		t.shards[i].fresh = make(map[string]bool)
	}
	return t
}

func (t *roomTable) shard(key string) *roomShard {
	return &t.shards[maphash.String(t.seed, key)%roomShards]
}

// claimFresh reports whether a login should ask the room service for the room's settings
// read from the store rather than its cache: true for one login at a time while the node has
// no member of the room. The room service's cache follows the store a little behind, and a
// node learns of later changes from their announcements on the room's subject.
func (t *roomTable) claimFresh(app, room string) bool {
	key := app + "/" + room
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.rooms[key] != nil || sh.fresh[key] {
		return false
	}
	sh.fresh[key] = true
	return true
}

// unclaimFresh gives up a claim whose join failed.
func (t *roomTable) unclaimFresh(app, room string) {
	key := app + "/" + room
	sh := t.shard(key)
	sh.mu.Lock()
	delete(sh.fresh, key)
	sh.mu.Unlock()
}

// join adds c to its room, subscribing to the room's broadcasts if c is the first local
// member; settings, cdn, counters, viewers and attrs are the room's, as the room service gave them at c's join, fresh
// from its store if c claimed that (claimFresh): they then replace those of a room that another
// login's answer, read from the cache, created meanwhile. It returns the room once the
// subscription is in place, so c misses nothing sent after. welcome runs as c is added, under
// the room's lock, before any write of the room can include c: it writes the LoginAck.
func (t *roomTable) join(c *conn, settings *roompb.RoomSettings, cdn *clientpb.CdnConfig, counters *clientpb.CounterTotals, viewers *clientpb.ViewerCount, attrs *clientpb.RoomAttributes, fresh bool, welcome func(*localRoom)) *localRoom {
	key := c.app + "/" + c.room
	sh := t.shard(key)
	sh.mu.Lock()
	if fresh {
		delete(sh.fresh, key)
	}
	r := sh.rooms[key]
	first := r == nil
	if !first && fresh {
		r.fanout.setSettings(settings)
		r.cdn.Store(cdn)
	}
	if !first && counters != nil {
		r.setCounters(counters)
	}
	if !first && attrs != nil {
		r.setAttributes(attrs) // attributes.go
	}
	if first {
		r = &localRoom{t: t, app: c.app, room: c.room, subject: bus.RoomSubject(c.app, c.room), ready: make(chan struct{})}
		r.cdn.Store(cdn)
		r.viewers.Store(viewers)
		r.attrs.Store(attrs)
		r.counters.Store(counters)
		r.fanout.init(r, settings, time.Now())
		sub, err := t.n.cfg.Bus.Subscribe(r.subject, func(m *nats.Msg) { r.receive(m.Data) })
		if err != nil {
			// Only a closed NATS connection fails here; the node is going down.
			t.n.log.Error("subscribe room", "subject", r.subject, "err", err)
		}
		r.sub = sub
		sh.rooms[key] = r
		t.n.m.rooms.Inc()
	}
	r.mu.Lock()
	r.add(c)
	welcome(r)
	r.mu.Unlock()
	sh.mu.Unlock()
	if first {
		// A round trip to the server: after it, the server routes the room's messages here.
		if err := t.n.cfg.Bus.Flush(); err != nil {
			t.n.log.Warn("flush after subscribe", "subject", r.subject, "err", err)
		}
		close(r.ready)
	}
	<-r.ready
	return r
}

// leave removes c from its room and drops the room when c was its last local member.
func (t *roomTable) leave(c *conn) {
	key := c.app + "/" + c.room
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.rooms[key]
	if r == nil {
		return
	}
	r.mu.Lock()
	r.remove(c)
	empty := r.size() == 0
	r.mu.Unlock()
	if empty {
		delete(sh.rooms, key)
		if r.sub != nil {
			_ = r.sub.Unsubscribe()
		}
		r.fanout.stop()
		r.stopCounters()
		t.n.m.rooms.Dec()
	}
}

// add puts c in the room, in the next of the room's phase slots (fanout.go), so that the slots
// stay even. Caller holds r.mu.
func (r *localRoom) add(c *conn) {
	c.slot = r.nextSlot
	r.nextSlot = (r.nextSlot + 1) % phaseSlots
	if r.slots[c.slot] == nil {
		r.slots[c.slot] = make(map[*conn]*tag.Set)
	}
	if r.sets == nil {
		r.sets = make(map[*tag.Set]int)
	}
	set := c.tags.Load()
	r.slots[c.slot][c] = set
	r.sets[set]++
}

// remove takes c out of the room. Caller holds r.mu.
func (r *localRoom) remove(c *conn) {
	set, ok := r.slots[c.slot][c]
	if !ok {
		return
	}
	delete(r.slots[c.slot], c)
	r.uncount(set)
}

// uncount takes a member with tag set set out of r.sets. Caller holds r.mu.
func (r *localRoom) uncount(set *tag.Set) {
	if r.sets[set]--; r.sets[set] <= 0 {
		delete(r.sets, set)
	}
}

// retag counts member c under its current tags in its room's sets.
func (t *roomTable) retag(c *conn) {
	key := c.app + "/" + c.room
	sh := t.shard(key)
	sh.mu.Lock()
	r := sh.rooms[key]
	sh.mu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	if old, ok := r.slots[c.slot][c]; ok {
		r.uncount(old)
		set := c.tags.Load()
		r.slots[c.slot][c] = set
		r.sets[set]++
	}
	r.mu.Unlock()
}

// size returns the number of members. Caller holds r.mu.
func (r *localRoom) size() int {
	n := 0
	for _, s := range r.slots {
		n += len(s)
	}
	return n
}

// each calls fn for every member in the slots of phase group g of p (slots g, g+p, g+2p, …);
// p = 1 is every member. Caller holds r.mu.
func (r *localRoom) each(g, p int, fn func(c *conn)) {
	for i := g; i < phaseSlots; i += p {
		for c := range r.slots[i] {
			fn(c)
		}
	}
}

// writeAcked encodes f once and writes it to every member whose LoginAck is written (cdnAcked),
// only to those that asked for the live state when liveOnly, and returns how many it wrote to;
// what names the frame in the log when it does not encode.
func (r *localRoom) writeAcked(f *clientpb.Frame, liveOnly bool, what string) int {
	b, err := proto.Marshal(f)
	if err != nil {
		r.t.n.log.Error("encode "+what, "err", err)
		return 0
	}
	written := 0
	r.mu.RLock()
	defer r.mu.RUnlock()
	r.each(0, 1, func(c *conn) {
		if c.cdnAcked && (c.liveState || !liveOnly) {
			c.write(b)
			written++
		}
	})
	return written
}

// count returns the number of rooms with local members.
func (t *roomTable) count() int {
	total := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		total += len(sh.rooms)
		sh.mu.Unlock()
	}
	return total
}

// counts returns the number of local members of every room with members on this node, and
// of those with each of the room's viewer tags.
func (t *roomTable) counts() []*buspb.RoomCount {
	var out []*buspb.RoomCount
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for key, r := range sh.rooms {
			app, room, _ := strings.Cut(key, "/")
			out = append(out, r.viewerCount(app, room)) // viewers.go
		}
		sh.mu.Unlock()
	}
	return out
}

// lookup returns a room with local members, or nil.
func (t *roomTable) lookup(app, room string) *localRoom {
	key := app + "/" + room
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.rooms[key]
}

// members returns the local members of a room.
func (t *roomTable) members(app, room string) []*conn {
	r := t.lookup(app, room)
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*conn, 0, r.size())
	r.each(0, 1, func(c *conn) { out = append(out, c) })
	return out
}
