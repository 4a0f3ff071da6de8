package chatlink

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
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
	mu    sync.Mutex // guards rooms and the membership changes of every room in this shard
	rooms map[string]*localRoom
}

// localRoom is one room's members on this node, its broadcast subscription and its fan-out
// state (fanout.go).
type localRoom struct {
	t       *roomTable
	subject string
	ready   chan struct{} // closed once the subscription is known to the NATS server

	mu      sync.RWMutex // guards members
	members map[*conn]struct{}
	sub     *nats.Subscription

	fanout roomFanout
}

func newRoomTable(n *Node) *roomTable {
	t := &roomTable{n: n, seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].rooms = make(map[string]*localRoom)
	}
	return t
}

func (t *roomTable) shard(key string) *roomShard {
	return &t.shards[maphash.String(t.seed, key)%roomShards]
}

// join adds c to its room, subscribing to the room's broadcasts if c is the first local
// member; settings are the room's, as the room service gave them at c's join. It returns once
// the subscription is in place, so c misses nothing sent after.
func (t *roomTable) join(c *conn, settings *pb.RoomSettings) {
	key := c.app + "/" + c.room
	sh := t.shard(key)
	sh.mu.Lock()
	r := sh.rooms[key]
	first := r == nil
	if first {
		r = &localRoom{t: t, subject: bus.RoomSubject(c.app, c.room), ready: make(chan struct{}), members: make(map[*conn]struct{})}
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
	r.members[c] = struct{}{}
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
}

// has reports whether the room has members on this node.
func (t *roomTable) has(app, room string) bool {
	key := app + "/" + room
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.rooms[key] != nil
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
	delete(r.members, c)
	empty := len(r.members) == 0
	r.mu.Unlock()
	if empty {
		delete(sh.rooms, key)
		if r.sub != nil {
			_ = r.sub.Unsubscribe()
		}
		r.fanout.stop()
		t.n.m.rooms.Dec()
	}
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
