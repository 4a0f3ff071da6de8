package chatlink

import (
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// Room attributes (docs/protocol.md, "Room attributes"): the app server's writes reach the node
// as a RoomBatch with the room's whole set and its version (the store's revision); the node
// keeps the newest and writes it to the members that asked for the live state, one frame
// encoded once. A node's first login of a room gets the set in the room service's join answer;
// every login gets it after its LoginAck (afterLoginAck).

// setAttributes takes the room's attributes: a newer version than the room has is written to
// its members.
func (r *localRoom) setAttributes(a *clientpb.RoomAttributes) {
	for {
		cur := r.attrs.Load()
		if cur != nil && cur.Version >= a.Version {
			return
		}
		if r.attrs.CompareAndSwap(cur, a) {
			break
		}
	}
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_RoomAttributes{RoomAttributes: a}})
	if err != nil {
		r.t.n.log.Error("encode room attributes", "err", err)
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	r.each(0, 1, func(c *conn) {
		if c.cdnAcked && c.liveState {
			c.write(b)
		}
	})
}
