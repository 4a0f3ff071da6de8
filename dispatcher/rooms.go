package dispatcher

import (
	"hash/maphash"
	"math"
	"sync"

	pb "roomcast/proto/roomcastpb"
)

// Room affinity (docs/dispatch.md): a room's new members go to a node that already holds the
// room, the fullest one whose share of the room is below the room's limit on it, so that a room
// occupies as few nodes as its size needs and each node subscribes to fewer rooms. Which node
// holds which room, and with how many members, comes from the load reports (rooms_held, the
// node's biggest rooms) plus the members the dispatcher itself sent there since the report, so
// a crowd arriving between two reports fills a node up to the limit and then opens the next
// instead of all landing on the one node that held the room.

// roomKey names a room.
type roomKey struct{ app, room string }

// roomTable is, per room, the nodes holding it. It is sharded like the ranking cache so that
// decisions for different rooms rarely meet on a lock.
type roomTable struct {
	seed   maphash.Seed
	shards [16]roomShard
}

type roomShard struct {
	// mu guards m and every roomHolders in it. Lock order: Dispatcher.mu -> roomShard.mu ->
	// node.roomsMu.
	mu sync.Mutex
	m  map[roomKey]*roomHolders
	_  [40]byte // keep shards on separate cache lines
}

// roomHolders is the nodes holding one room.
type roomHolders struct {
	on []roomOn
}

// roomOn is a room's members on one node: what the node's report said and what the dispatcher
// sent since. Counts belong to the node's report generation gen; once the node reports again
// they count nothing until that report (or a decision) renews them.
type roomOn struct {
	n        *node
	gen      uint64
	reported int64
	sent     int64
}

// members is the room's predicted members on the node.
func (o *roomOn) members() int64 {
	if o.gen != o.n.reportGen.Load() {
		return 0
	}
	return o.reported + o.sent
}

func (t *roomTable) init() {
	t.seed = maphash.MakeSeed()
	for i := range t.shards {
		t.shards[i].m = make(map[roomKey]*roomHolders)
	}
}

func (t *roomTable) shard(k roomKey) *roomShard {
	h := maphash.String(t.seed, k.room) ^ maphash.String(t.seed, k.app)*0x9e3779b97f4a7c15
	return &t.shards[h%uint64(len(t.shards))]
}

// entry returns n's entry for k, creating it if need be; the second result says whether the
// entry is new to the current report generation (the caller remembers the key on the node, so
// the next report can clear it). Caller holds the shard's mu.
func (sh *roomShard) entry(k roomKey, n *node, gen uint64) (*roomOn, bool) {
	h := sh.m[k]
	if h == nil {
		h = &roomHolders{}
		sh.m[k] = h
	}
	for i := range h.on {
		if o := &h.on[i]; o.n == n {
			if o.gen == gen {
				return o, false
			}
			*o = roomOn{n: n, gen: gen}
			return o, true
		}
	}
	h.on = append(h.on, roomOn{n: n, gen: gen})
	return &h.on[len(h.on)-1], true
}

// report records the rooms a node's report of generation gen lists and returns their keys.
func (t *roomTable) report(n *node, gen uint64, rooms []*pb.RoomCount) []roomKey {
	keys := make([]roomKey, 0, len(rooms))
	for _, rc := range rooms {
		k := roomKey{rc.App, rc.Room}
		sh := t.shard(k)
		sh.mu.Lock()
		o, _ := sh.entry(k, n, gen)
		o.reported, o.sent = rc.Members, 0
		sh.mu.Unlock()
		keys = append(keys, k)
	}
	return keys
}

// forget drops n's entries for keys that are older than generation gen (all of them for
// gen = math.MaxUint64), and the rooms left with no node.
func (t *roomTable) forget(n *node, gen uint64, keys []roomKey) {
	for _, k := range keys {
		sh := t.shard(k)
		sh.mu.Lock()
		if h := sh.m[k]; h != nil {
			for i := range h.on {
				if o := &h.on[i]; o.n == n {
					if o.gen < gen {
						h.on[i] = h.on[len(h.on)-1]
						h.on = h.on[:len(h.on)-1]
					}
					break
				}
			}
			if len(h.on) == 0 {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// held returns the room's predicted members per node: for the admin view and tests.
func (t *roomTable) held(k roomKey) map[string]int64 {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make(map[string]int64)
	if h := sh.m[k]; h != nil {
		for i := range h.on {
			if m := h.on[i].members(); m > 0 {
				out[h.on[i].n.name] = m
			}
		}
	}
	return out
}

// roomsReported updates the room table from node n's report r. Caller holds d.mu, which orders the
// reports of a node.
func (d *Dispatcher) roomsReported(n *node, r *pb.LoadReport) {
	gen := n.reportGen.Add(1)
	held := d.rooms.report(n, gen, r.RoomsHeld)
	n.roomsMu.Lock()
	sent := n.sentRooms
	n.sentRooms = nil
	n.roomsMu.Unlock()
	d.rooms.forget(n, gen, n.heldRooms)
	d.rooms.forget(n, gen, sent)
	n.heldRooms = held
}

// roomsRemoved drops every room entry of a node that is out. Caller holds d.mu.
func (d *Dispatcher) roomsRemoved(n *node) {
	n.roomsMu.Lock()
	sent := n.sentRooms
	n.sentRooms = nil
	n.roomsMu.Unlock()
	d.rooms.forget(n, math.MaxUint64, n.heldRooms)
	d.rooms.forget(n, math.MaxUint64, sent)
	n.heldRooms = nil
}

// roomAffinity says whether rooms steer decisions (Config.RoomShare is not negative).
func (d *Dispatcher) roomAffinity() bool { return d.cfg.RoomShare > 0 }

// Results of a room member's decision, for roomcast_dispatcher_room_decisions_total.
const (
	roomJoined   = iota // a node holding the room, below the room's limit on it
	roomOpened          // a node of the client's tier not holding the room yet
	roomOverflow        // every node of the tier that has capacity holds the room at its limit
	numRoomResults
)

var roomResultNames = [numRoomResults]string{"joined", "opened", "overflow"}

// placeInRoom picks the first node of the answer for a member of room k, counts the member
// against it, and puts the answer's nodes first in sc or returns the holder to put before
// them. sc is r's candidates scored for the client, best first, and not empty.
//
// The order is: capacity (a full node only when no node has room), then locality (the best
// region and ISP points among the nodes with capacity: the tier), then room affinity within
// the tier (the holder with the most members below its limit), then score.
func (d *Dispatcher) placeInRoom(k roomKey, loc location, r *ranking, sc []scored, now int64) (first pick, k2 int, holder bool) {
	tier := math.Inf(-1)
	for _, s := range sc {
		if s.score > -fullPenalty/2 {
			tier = max(tier, r.cands[s.i].locality)
		}
	}
	sh := d.rooms.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var best *roomOn
	var bestMembers int64
	var bestScore float64
	if h := sh.m[k]; h != nil {
		for i := range h.on {
			o := &h.on[i]
			members := o.members()
			if members <= 0 || o.n.removed.Load() {
				continue
			}
			s := o.n.snap.Load()
			if s.draining || o.n.stale(s, now) {
				continue
			}
			locality := d.cfg.Weights.locality(loc.region.match(s.region), loc.matchesISP(s))
			if locality < tier {
				continue
			}
			score := d.liveScore(s, o.n.assigned.Load(), now, locality)
			if score < -fullPenalty/2 {
				continue
			}
			if locality > tier {
				// Nearer than every candidate with capacity (the ranking did not keep it):
				// the tier is this holder's.
				tier, best = locality, nil
			}
			if float64(members) >= d.cfg.RoomShare*s.capacity*d.slowStartShare(s, now) {
				continue
			}
			if best == nil || members > bestMembers || members == bestMembers && score > bestScore {
				best, bestMembers, bestScore = o, members, score
			}
		}
	}
	if best != nil {
		best.sent++
		best.n.assigned.Add(1)
		d.m.roomDecisions[roomJoined].Inc()
		s := best.n.snap.Load()
		level := loc.region.match(s.region)
		return pick{n: best.n, level: level, sameISP: loc.matchesISP(s)}, 0, true
	}
	// No holder can take the member: open a node of the tier that does not hold the room,
	// chosen like any client's; if there is none, the room grows past its limit on the best
	// node left.
	h := sh.m[k]
	open, filtered := sc, false
	var buf [maxCandidates]scored
	if !math.IsInf(tier, -1) {
		open, filtered = buf[:0], true
		for _, s := range sc {
			c := &r.cands[s.i]
			if s.score > -fullPenalty/2 && c.locality == tier && !h.holds(c.n) {
				open = append(open, s)
			}
		}
	}
	result := roomOpened
	if len(open) == 0 {
		open, filtered, result = sc, false, roomOverflow
	}
	k2 = d.choose(open)
	c := &r.cands[open[0].i]
	if filtered {
		// The answer is the chosen node, then the others best first.
		chosen := open[0]
		j := 0
		for j < len(sc) && sc[j].i != chosen.i {
			j++
		}
		copy(sc[1:j+1], sc[:j])
		sc[0] = chosen
		k2 = min(d.cfg.TopK, len(sc))
	}
	o, fresh := sh.entry(k, c.n, c.n.reportGen.Load())
	if fresh {
		c.n.roomsMu.Lock()
		c.n.sentRooms = append(c.n.sentRooms, k)
		c.n.roomsMu.Unlock()
	}
	o.sent++
	c.n.assigned.Add(1)
	d.m.roomDecisions[result].Inc()
	return pick{n: c.n, level: c.level, sameISP: c.sameISP}, k2, false
}

// holds says whether n has members of the room. h may be nil. Caller holds the shard's mu.
func (h *roomHolders) holds(n *node) bool {
	if h == nil {
		return false
	}
	for i := range h.on {
		if h.on[i].n == n {
			return h.on[i].members() > 0
		}
	}
	return false
}
