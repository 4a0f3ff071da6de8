package chatlink

import (
	"hash/maphash"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

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
	mu    sync.Mutex // guards rooms and every member set's membership changes in this shard
	rooms map[string]*localRoom
}

// localRoom is one room's members on this node and its broadcast subscription.
type localRoom struct {
	subject string
	ready   chan struct{} // closed once the subscription is known to the NATS server

	mu      sync.RWMutex // guards members
	members map[*conn]struct{}
	sub     *nats.Subscription
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
// member. It returns once the subscription is in place, so c misses nothing sent after.
func (t *roomTable) join(c *conn) {
	key := c.app + "/" + c.room
	sh := t.shard(key)
	sh.mu.Lock()
	r := sh.rooms[key]
	first := r == nil
	if first {
		r = &localRoom{subject: bus.RoomSubject(c.app, c.room), ready: make(chan struct{}), members: make(map[*conn]struct{})}
		sub, err := t.n.cfg.Bus.Subscribe(r.subject, func(m *nats.Msg) { t.deliver(r, m.Data) })
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

// deliver fans a room batch out to the room's local members. The Push frame is encoded once
// and the same bytes go to every member; a member that sent some of the batch's messages gets
// a variant without them, so senders see a SendAck and no echo.
func (t *roomTable) deliver(r *localRoom, data []byte) {
	var batch pb.RoomBatch
	if err := proto.Unmarshal(data, &batch); err != nil || len(batch.Messages) == 0 {
		t.n.log.Warn("dropping room batch that does not parse", "subject", r.subject)
		return
	}
	prefix := t.n.cfg.Node + "-"
	var localSenders []string
	for _, s := range batch.SenderSessions {
		if strings.HasPrefix(s, prefix) {
			localSenders = append(localSenders, s)
		}
	}
	full, err := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Push{Push: &pb.Push{Messages: batch.Messages}}})
	if err != nil {
		t.n.log.Error("encode push", "err", err)
		return
	}
	delivered := 0
	r.mu.RLock()
	for c := range r.members {
		if len(localSenders) > 0 && contains(localSenders, c.session) {
			if b, n := withoutSender(&batch, c.session); n > 0 {
				c.t.write(b)
				delivered += n
			}
			continue
		}
		c.t.write(full)
		delivered += len(batch.Messages)
	}
	r.mu.RUnlock()
	t.n.m.deliveries.Add(float64(delivered))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// withoutSender encodes a Push of the batch's messages not sent by session, and their count.
func withoutSender(batch *pb.RoomBatch, session string) ([]byte, int) {
	msgs := make([]*pb.Message, 0, len(batch.Messages))
	for i, m := range batch.Messages {
		if i < len(batch.SenderSessions) && batch.SenderSessions[i] == session {
			continue
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return nil, 0
	}
	b, err := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Push{Push: &pb.Push{Messages: msgs}}})
	if err != nil {
		return nil, 0
	}
	return b, len(msgs)
}
