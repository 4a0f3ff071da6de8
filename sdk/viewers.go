package sdk

import (
	"maps"

	"roomcast/proto/clientpb"
)

// Viewer counts and member notices (docs/protocol.md, "Viewer counts"): the room's members
// online over every ChatLink come a few seconds apart (3 s by default), only when the count
// changed, never a message per join; a small room whose settings ask for it also tells of each
// join and leave.

// ViewerCountEvent: the room's members online changed (or the client logged in). Tags holds,
// for each tag the room's settings name (viewer_tags), how many members online have it.
type ViewerCountEvent struct {
	Online int64
	Tags   map[string]int64
}

// MemberNoticeEvent: a member joined (Left false) or left the room. Only rooms whose settings
// ask for notices, while they have at most 100 members online, send them.
type MemberNoticeEvent struct {
	UID  string
	Left bool
}

func (*ViewerCountEvent) event()  {}
func (*MemberNoticeEvent) event() {}

// Viewers returns the room's members online as the Client last received them, and per viewer
// tag; 0 and nil before any.
func (c *Client) Viewers() (online int64, tags map[string]int64) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return c.d.viewers.Online, maps.Clone(c.d.viewers.Tags)
}

// viewerCount takes a ViewerCount frame.
func (d *delivery) viewerCount(v *clientpb.ViewerCount) {
	ev := &ViewerCountEvent{Online: v.GetOnline()}
	for _, t := range v.GetTags() {
		if ev.Tags == nil {
			ev.Tags = make(map[string]int64, len(v.GetTags()))
		}
		ev.Tags[t.GetTag()] = t.GetMembers()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.viewers = *ev
	d.enqueueLocked(item{ev: ev})
}

// memberNotice takes a MemberNotice frame: one event per change.
func (d *delivery) memberNotice(n *clientpb.MemberNotice) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ch := range n.GetChanges() {
		d.enqueueLocked(item{ev: &MemberNoticeEvent{UID: ch.GetUid(), Left: ch.GetLeft()}})
	}
}
