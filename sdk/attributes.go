package sdk

import (
	"maps"

	"roomcast/proto/clientpb"
)

// Room attributes (docs/protocol.md, "Room attributes"): a room's small key/value set set by the
// app server (an announcement, a pinned message, app data), received after the login and again,
// whole, whenever it changes.

// RoomAttributesEvent: the room's attributes changed (or the client logged in to a room that has
// some). Attrs holds every attribute by key, a removed one absent; Version grows with every
// change, and the Client hands over only sets newer than the last it handed over.
type RoomAttributesEvent struct {
	Attrs   map[string]string
	Version uint64
}

func (*RoomAttributesEvent) event() {}

// Attributes returns the room's attributes as the Client last received them (nil before any),
// and their version.
func (c *Client) Attributes() (map[string]string, uint64) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return maps.Clone(c.d.attrs), c.d.attrsVersion
}

// attributes takes a RoomAttributes frame: a newer set than the last is handed to the app.
func (d *delivery) attributes(a *clientpb.RoomAttributes) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || a.GetVersion() <= d.attrsVersion {
		return
	}
	attrs := make(map[string]string, len(a.GetAttributes()))
	for _, kv := range a.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue()
	}
	d.attrs, d.attrsVersion = attrs, a.GetVersion()
	d.enqueueLocked(item{ev: &RoomAttributesEvent{Attrs: maps.Clone(attrs), Version: a.GetVersion()}})
}
