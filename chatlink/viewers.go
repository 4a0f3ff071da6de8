package chatlink

import (
	"context"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// Viewer counts (docs/protocol.md, "Viewer counts"): every Config.ViewerInterval the node sends
// the room service one ViewerWindow naming its members in each of its rooms (and, for rooms
// with viewer_tags, how many carry each tag), for all its rooms at once (in chunks of
// viewerChunk); the answer has each room's members over every node, and the node writes a
// ViewerCount frame, encoded once per room, to a room's members when the count changed. A join
// or a leave costs nothing on the bus: the next window carries it.
//
// Join and leave notices: a room whose settings ask for them (member_notices) and whose count is
// at most MemberNoticesMax has each login and logout of a member published by its node on the
// room's subject (a RoomBatch with member_changes), which every node holding the room writes to
// its members as a MemberNotice. A bigger room's members are never told.

// DefaultViewerInterval is how often a node sends its rooms' member counts and writes the
// rooms' viewer counts that changed.
const DefaultViewerInterval = 3 * time.Second

// MemberNoticesMax is the most members a room may have online for its members to be told of
// joins and leaves (a room with member_notices set).
const MemberNoticesMax = 100

// viewerChunk bounds the rooms of one ViewerWindow (the room service refuses more than 2000).
const viewerChunk = 1000

// viewersLoop sends the rooms' counts every Config.ViewerInterval until the node stops.
func (n *Node) viewersLoop() {
	t := time.NewTicker(n.cfg.ViewerInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.sendViewers()
		}
	}
}

// sendViewers sends the node's members per room to the room service and writes the totals it
// answers to the rooms' members.
func (n *Node) sendViewers() {
	rooms := n.rooms.counts()
	for i := 0; i < len(rooms); i += viewerChunk {
		w := &buspb.ViewerWindow{Node: n.cfg.Node, Boot: n.stream.boot, Rooms: rooms[i:min(i+viewerChunk, len(rooms))]}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
		var rep buspb.Reply
		err := n.request(ctx, busViewers, bus.SubjectRoomViewers, w, &rep)
		cancel()
		if err != nil || rep.Code != 0 {
			n.log.Warn("viewer window not answered", "rooms", len(w.Rooms), "err", err, "code", rep.Code)
			continue
		}
		for _, v := range rep.Viewers {
			if r := n.rooms.lookup(v.App, v.Room); r != nil {
				r.setViewers(viewerCountOf([]*buspb.RoomCount{v}))
			}
		}
	}
}

// viewerCountOf returns the first room's count as a client frame's; nil when there is none.
func viewerCountOf(rooms []*buspb.RoomCount) *clientpb.ViewerCount {
	if len(rooms) == 0 {
		return nil
	}
	return &clientpb.ViewerCount{Online: rooms[0].Members, Tags: rooms[0].Tags}
}

// viewerCount returns the room's local members, and those with each of its viewer tags. The
// caller holds the room's shard lock (the lock order lets it take the fan-out's, then the
// room's).
func (r *localRoom) viewerCount(app, room string) *buspb.RoomCount {
	r.fanout.mu.Lock()
	tags := r.fanout.settings.viewerTags
	r.fanout.mu.Unlock()
	r.mu.RLock()
	defer r.mu.RUnlock()
	rc := &buspb.RoomCount{App: app, Room: room, Members: int64(r.size())}
	for _, t := range tags {
		var members int64
		for set, k := range r.sets {
			if _, ok := slices.BinarySearch(set.Tags, t); ok {
				members += int64(k)
			}
		}
		rc.Tags = append(rc.Tags, &clientpb.ViewerTagCount{Tag: t, Members: members})
	}
	return rc
}

// setViewers takes the room's count from the room service and writes it to the members that
// have had their LoginAck when it changed.
func (r *localRoom) setViewers(v *clientpb.ViewerCount) {
	if old := r.viewers.Swap(v); proto.Equal(old, v) {
		return
	}
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_ViewerCount{ViewerCount: v}}, true, "viewer count")
}

// memberNotice publishes c's join (or leave) on its room's subject when the room asks for
// notices and is small.
func (n *Node) memberNotice(c *conn, r *localRoom, left bool) {
	r.fanout.mu.Lock()
	on := r.fanout.settings.memberNotices
	r.fanout.mu.Unlock()
	if !on {
		return
	}
	online := r.viewers.Load().GetOnline()
	r.mu.RLock()
	local := int64(r.size())
	r.mu.RUnlock()
	if max(online, local) > MemberNoticesMax {
		return
	}
	batch := &buspb.RoomBatch{MemberChanges: []*clientpb.MemberChange{{Uid: c.uid, Left: left}}}
	if err := bus.Publish(n.cfg.Bus, r.subject, batch); err != nil {
		n.log.Warn("member notice not published", "app", r.app, "room", r.room, "err", err)
	}
}

// writeMemberNotice writes members' joins and leaves to the room's members.
func (r *localRoom) writeMemberNotice(changes []*clientpb.MemberChange) {
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_MemberNotice{MemberNotice: &clientpb.MemberNotice{Changes: changes}}}, true, "member notice")
}
