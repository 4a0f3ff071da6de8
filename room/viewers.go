package room

import (
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// Viewer counts (docs/protocol.md, "Viewer counts"): every viewer interval a ChatLink sends one
// ViewerWindow naming its members per room, for all its rooms at once; the instance that takes
// it puts the node's counts into its distribution (fresher than the node's last report) and
// answers each room's members over every node as it knows them: this node's from the window,
// the others' from their reports. The ChatLink writes the totals to its members. So a room
// costs the bus a few dozen bytes per node and interval, and a join costs nothing.

// maxViewerRooms bounds the rooms of one ViewerWindow; a node with more sends several.
const maxViewerRooms = 2000

// onViewers takes a ChatLink's viewer window and answers the rooms' totals.
func (s *Service) onViewers(msg *nats.Msg) {
	var w buspb.ViewerWindow
	if rep := decode(msg, &w); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	if w.Node == "" || len(w.Rooms) > maxViewerRooms {
		bus.Respond(s.log, msg, &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "a viewer window names its node and at most 2000 rooms"})
		return
	}
	for _, rc := range w.Rooms {
		if !auth.ValidName(rc.App) || !auth.ValidName(rc.Room) {
			bus.Respond(s.log, msg, &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "app and room must be valid names"})
			return
		}
	}
	s.dist.take(&w, s.cfg.Now())
	out := &buspb.Reply{Viewers: make([]*buspb.RoomCount, len(w.Rooms))}
	for i, rc := range w.Rooms {
		out.Viewers[i] = s.dist.viewers(rc.App, rc.Room)
	}
	bus.Respond(s.log, msg, out)
}

// take puts a node's viewer window into the distribution: its counts of the rooms it names
// replace those of its last report, until its next report.
func (d *distribution) take(w *buspb.ViewerWindow, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[w.Node]
	if n == nil || n.boot != w.Boot {
		// A node not heard of yet (its first report is on its way), or that restarted: its
		// window starts its record, which its reports then keep.
		n = &nodeRooms{boot: w.Boot, rooms: make(map[roomKey]counted)}
		d.nodes[w.Node] = n
	}
	n.seen = now
	for _, rc := range w.Rooms {
		n.rooms[roomKey{rc.App, rc.Room}] = counted{members: rc.Members, tags: rc.Tags, seq: n.seq}
	}
}

// viewers returns a room's members over every node, and per tag where the nodes count them.
func (d *distribution) viewers(app, room string) *buspb.RoomCount {
	k := roomKey{app, room}
	out := &buspb.RoomCount{App: app, Room: room}
	var byTag map[string]int64
	var order []string
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.nodes {
		c := n.rooms[k]
		out.Members += c.members
		for _, t := range c.tags {
			if byTag == nil {
				byTag = make(map[string]int64)
			}
			if _, ok := byTag[t.Tag]; !ok {
				order = append(order, t.Tag)
			}
			byTag[t.Tag] += t.Members
		}
	}
	for _, t := range order {
		out.Tags = append(out.Tags, &clientpb.ViewerTagCount{Tag: t, Members: byTag[t]})
	}
	return out
}
