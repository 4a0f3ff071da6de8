package room

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nats-io/nats.go"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// distribution is which nodes hold which rooms, and how many members each, as the ChatLinks'
// reports say (bus.SubjectSessionsReport). Every instance hears every report, so every instance
// can answer; a node whose reports stop for the lease time is dropped with its members. Counts
// are as fresh as the last report (ReportInterval, 1s by default): exact enough for a display,
// and they cost nothing per login.
type distribution struct {
	mu    sync.Mutex // guards nodes
	nodes map[string]*nodeRooms
}

type nodeRooms struct {
	boot  string
	seq   uint64 // of the report being received
	seen  time.Time
	rooms map[roomKey]counted
}

type counted struct {
	members int64
	tags    []*clientpb.ViewerTagCount // for rooms with viewer_tags: members with each
	seq     uint64                     // the report that said so
}

type roomKey struct{ app, room string }

func newDistribution() *distribution { return &distribution{nodes: make(map[string]*nodeRooms)} }

func (d *distribution) onReport(msg *nats.Msg) {
	var rep buspb.NodeReport
	if err := proto.Unmarshal(msg.Data, &rep); err != nil || rep.Node == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[rep.Node]
	if n == nil || n.boot != rep.Boot {
		n = &nodeRooms{boot: rep.Boot, rooms: make(map[roomKey]counted)}
		d.nodes[rep.Node] = n
	}
	if rep.Seq < n.seq {
		return
	}
	n.seq = rep.Seq
	n.seen = time.Now()
	for _, rc := range rep.Rooms {
		n.rooms[roomKey{rc.App, rc.Room}] = counted{members: rc.Members, tags: rc.Tags, seq: rep.Seq}
	}
	if rep.Last {
		// Rooms the report did not name have no members on the node any more.
		for k, c := range n.rooms {
			if c.seq < rep.Seq {
				delete(n.rooms, k)
			}
		}
	}
}

// expire drops the nodes whose last report is older than ttl.
func (d *distribution) expire(now time.Time, ttl time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, n := range d.nodes {
		if now.Sub(n.seen) > ttl {
			delete(d.nodes, name)
		}
	}
}

// info returns a room's members online, per node.
// online returns the room's members over all nodes, without building the per-node map.
func (d *distribution) online(app, room string) int64 {
	k := roomKey{app, room}
	d.mu.Lock()
	defer d.mu.Unlock()
	var total int64
	for _, n := range d.nodes {
		total += n.rooms[k].members
	}
	return total
}

func (d *distribution) info(app, room string) *buspb.RoomInfo {
	info := &buspb.RoomInfo{App: app, Room: room, Nodes: make(map[string]int64)}
	k := roomKey{app, room}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, n := range d.nodes {
		if c, ok := n.rooms[k]; ok && c.members > 0 {
			info.Nodes[name] = c.members
			info.Online += c.members
		}
	}
	return info
}
