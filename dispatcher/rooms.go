package dispatcher

import (
	"hash/maphash"
	"math"
	"sync"

	"roomcast/internal/buspb"
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
	// m is keyed by the room's 64-bit hash (roomTable.hash), which stands for the room: a
	// decision hashes the room once, the map compares integers, and the table keeps no names.
	// Two rooms whose hashes collide (about one pair in 3 million among 10 million rooms)
	// would share their holders: a placement hint gone wrong, nothing a member would notice.
	// The holders are kept in the map by value: one memory access fewer per decision.
	m map[uint64]roomHolders
	_ [40]byte // keep shards on separate cache lines
}

// roomHolders is the nodes holding one room: slots[i] is on[i].n's slot. A decision classes
// every holder by locality through its ranking's classOf, and reads the entries of the few in
// its client's tier: kept apart, the slots of a room's holders share one cache line.
type roomHolders struct {
	slots []uint32
	on    []roomOn
}

// roomOn is a room's members on one node: what the node's report said and what the dispatcher
// sent since. Counts belong to the node's report generation gen; once the node reports again
// they count nothing until that report (or a decision) renews them.
type roomOn struct {
	n        *node
	gen      uint64
	reported int64
	// carried is what the dispatcher sent in the generation before, when this report does not
	// list the room: clients on their way (dispatched, not yet in the room when the node
	// reported). Without it a room just opened on a node would lose the node at its first
	// report and spread its next members over others.
	carried int64
	sent    int64
}

// members is the room's predicted members on the node.
func (o *roomOn) members() int64 {
	if o.gen != o.n.reportGen.Load() {
		return 0
	}
	return o.reported + o.carried + o.sent
}

func (t *roomTable) init() {
	t.seed = maphash.MakeSeed()
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]roomHolders)
	}
}

// hash is a room's key in its shard's map; its low bits pick the shard.
func (t *roomTable) hash(k roomKey) uint64 {
	return maphash.String(t.seed, k.room) ^ maphash.String(t.seed, k.app)*0x9e3779b97f4a7c15
}

func (t *roomTable) shard(h uint64) *roomShard { return &t.shards[h%uint64(len(t.shards))] }

// entry returns n's entry for k, creating it if need be; the second result says whether the
// entry is new to the current report generation (the caller remembers the key on the node, so
// the next report can clear it). Caller holds the shard's mu.
func (sh *roomShard) entry(h uint64, n *node, gen uint64) (*roomOn, bool) {
	r := sh.m[h]
	for i := range r.on {
		if o := &r.on[i]; o.n == n {
			if o.gen == gen {
				return o, false
			}
			*o = roomOn{n: n, gen: gen}
			return o, true
		}
	}
	r.on = append(r.on, roomOn{n: n, gen: gen})
	r.slots = append(r.slots, n.slot)
	sh.m[h] = r
	return &r.on[len(r.on)-1], true
}

// report records the rooms a node's report of generation gen lists and returns their hashes.
func (t *roomTable) report(n *node, gen uint64, rooms []*buspb.RoomCount) []uint64 {
	keys := make([]uint64, 0, len(rooms))
	for _, rc := range rooms {
		h := t.hash(roomKey{rc.App, rc.Room})
		sh := t.shard(h)
		sh.mu.Lock()
		o, _ := sh.entry(h, n, gen)
		o.reported, o.carried, o.sent = rc.Members, 0, 0
		sh.mu.Unlock()
		keys = append(keys, h)
	}
	return keys
}

// settle ends n's entries for keys that report generation gen did not renew: an entry the
// dispatcher sent members to in the generation just ended is carried into gen (its members
// may be on their way) and its key returned; the others, and every entry when gen is
// math.MaxUint64 (the node is out), are dropped, with the rooms left with no node.
func (t *roomTable) settle(n *node, gen uint64, keys []uint64, carried []uint64) []uint64 {
	for _, h := range keys {
		sh := t.shard(h)
		sh.mu.Lock()
		if r, ok := sh.m[h]; ok {
			for i := range r.on {
				o := &r.on[i]
				if o.n != n || o.gen >= gen {
					continue
				}
				if o.gen == gen-1 && o.sent > 0 {
					*o = roomOn{n: n, gen: gen, carried: o.sent}
					carried = append(carried, h)
				} else {
					last := len(r.on) - 1
					r.on[i], r.slots[i] = r.on[last], r.slots[last]
					r.on, r.slots = r.on[:last], r.slots[:last]
					sh.m[h] = r
				}
				break
			}
			if len(r.on) == 0 {
				delete(sh.m, h)
			}
		}
		sh.mu.Unlock()
	}
	return carried
}

// held returns the room's predicted members per node: for the admin view and tests.
func (t *roomTable) held(k roomKey) map[string]int64 {
	hash := t.hash(k)
	sh := t.shard(hash)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make(map[string]int64)
	if h, ok := sh.m[hash]; ok {
		for i := range h.on {
			if m := h.on[i].members(); m > 0 {
				out[h.on[i].n.name] = m
			}
		}
	}
	return out
}

// roomsReported updates the room table from node n's report r. Caller holds d.mu, which
// orders the reports of a node.
func (d *Dispatcher) roomsReported(n *node, r *buspb.LoadReport) {
	gen := n.reportGen.Add(1)
	held := d.rooms.report(n, gen, r.RoomsHeld)
	n.roomsMu.Lock()
	sent := n.sentRooms
	n.sentRooms = nil
	n.roomsMu.Unlock()
	carried := d.rooms.settle(n, gen, n.heldRooms, nil)
	carried = d.rooms.settle(n, gen, sent, carried)
	n.heldRooms = held
	if len(carried) > 0 {
		// Forgotten at the next report unless it lists them or they get members meanwhile.
		n.roomsMu.Lock()
		n.sentRooms = append(n.sentRooms, carried...)
		n.roomsMu.Unlock()
	}
}

// roomsRemoved drops every room entry of a node that is out. Caller holds d.mu.
func (d *Dispatcher) roomsRemoved(n *node) {
	n.roomsMu.Lock()
	sent := n.sentRooms
	n.sentRooms = nil
	n.roomsMu.Unlock()
	d.rooms.settle(n, math.MaxUint64, n.heldRooms, nil)
	d.rooms.settle(n, math.MaxUint64, sent, nil)
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
// them. sc is r's candidates scored for the client, best first, and not empty; pool is the
// client's reserved pool (0: none), and holders outside it are passed over.
//
// The order is: capacity (a full node only when no node has room), then locality (the best
// region and ISP points among the nodes with capacity: the tier), then room affinity within
// the tier (the holder with the most members below its limit), then score.
func (d *Dispatcher) placeInRoom(k roomKey, loc location, pool uint32, r *ranking, sc []scored, now int64) (first pick, k2 int, holder bool) {
	tier := math.Inf(-1)
	for _, s := range sc {
		if s.score > -fullPenalty/2 {
			tier = max(tier, r.cands[s.i].locality)
		}
	}
	hash := d.rooms.hash(k)
	sh := d.rooms.shard(hash)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var best *roomOn
	var bestMembers int64
	var bestScore float64
	var bestPick pick
	h := sh.m[hash]
	// The ranking's classes hold while no node joined, left or changed its labels since it was
	// built; otherwise (a ranking served while another decision rebuilds it) each holder is
	// classed from its snapshot.
	var index []int32
	if r.live != nil && r.gen == d.gen.Load() {
		index = r.live.index
	}
	for i, slot := range h.slots {
		// Locality first: most holders of a big room are elsewhere, and are passed over
		// without reading their entry or their node.
		j := int32(-1)
		if int(slot) < len(index) {
			j = index[slot]
		}
		var class uint8
		var s *nodeSnap
		if j >= 0 {
			if class = r.classes[j]; class == classOut {
				continue
			}
		} else {
			// Not live when the ranking was built: draining, or new since.
			if s = h.on[i].n.snap.Load(); s.draining || d.pools.Load().nodePool(s.pool) != pool {
				continue
			}
			nl := s.labels()
			class = loc.class(&nl, s)
		}
		locality := d.classPoints[class]
		if locality < tier {
			continue
		}
		o := &h.on[i]
		members := o.members()
		if members <= 0 || o.n.removed.Load() {
			continue
		}
		if s == nil {
			s = o.n.snap.Load()
		}
		if s.draining || o.n.stale(s, now) {
			continue
		}
		score := d.liveScore(s, o.n.assigned.Load(), now, locality)
		if score < -fullPenalty/2 {
			continue
		}
		if locality > tier {
			// Nearer than every candidate with capacity (the ranking did not keep it): the
			// tier is this holder's.
			tier, best = locality, nil
		}
		if float64(members) >= d.cfg.RoomShare*s.capacity*d.slowStartShare(s, now) {
			continue
		}
		if best == nil || members > bestMembers || members == bestMembers && score > bestScore {
			best, bestMembers, bestScore = o, members, score
			bestPick = pick{n: o.n, level: matchLevel(class / 2), sameISP: class%2 == 1}
		}
	}
	if best != nil {
		best.sent++
		best.n.assigned.Add(1)
		d.m.roomDecisions[roomJoined].Inc()
		return bestPick, 0, true
	}
	// No holder can take the member: open a node of the tier that does not hold the room,
	// chosen like any client's; if there is none, the room grows past its limit on the best
	// node left.
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
		open, filtered = sc, false
	}
	if !filtered {
		// Every node of the tier holds the room at its limit, or every node is full.
		result = roomOverflow
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
	o, fresh := sh.entry(hash, c.n, c.n.reportGen.Load())
	if fresh {
		c.n.roomsMu.Lock()
		c.n.sentRooms = append(c.n.sentRooms, hash)
		c.n.roomsMu.Unlock()
	}
	o.sent++
	c.n.assigned.Add(1)
	d.m.roomDecisions[result].Inc()
	return pick{n: c.n, level: c.level, sameISP: c.sameISP}, k2, false
}

// holds says whether n has members of the room. Caller holds the shard's mu.
func (h *roomHolders) holds(n *node) bool {
	for i := range h.on {
		if h.on[i].n == n {
			return h.on[i].members() > 0
		}
	}
	return false
}
