package chatlink

import (
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// A room in CDN mode (docs/cdn.md) has a CdnConfig: its CDN lanes come to members as segments
// they poll, not over their connections. The node learns the config with the room's first
// login (the room service's answer) and keeps it current from the CDN manager's announcements
// on the room's subject; it gives it to each login in the LoginAck and tells every member when it
// changes, in a CdnConfig frame. The node never carries the CDN lanes themselves: the room
// service sends them to a pusher.

// cdnConfig returns the room's CDN config, or nil when the room is not in CDN mode. A room
// leaving CDN mode has an off config with the last segment index to poll (last_index): a member
// that logs in before that window has passed polls up to it too.
func (r *localRoom) cdnConfig() *clientpb.CdnConfig {
	cfg := r.cdn.Load()
	switch {
	case cfg.GetMode() != clientpb.CdnMode_CDN_MODE_OFF:
		return cfg
	case cfg.GetLastIndex() != 0 && cfg.GetWindowMs() > 0 && segment.Index(time.Now().UnixMilli(), cfg.GetWindowMs()) <= cfg.GetLastIndex():
		return cfg
	}
	return nil
}

// setCdn takes a change of the room's CDN config and sends it to every member that has had its
// LoginAck (the others get it in theirs, or from afterLoginAck).
func (r *localRoom) setCdn(cfg *clientpb.CdnConfig) {
	r.cdn.Store(cfg)
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_CdnConfig{CdnConfig: cfg}}, false, "CDN config")
}

// afterLoginAck is called once c's LoginAck, carrying sent, is written: from now on setCdn
// tells c of changes, and a change that came between the LoginAck and now is sent at once; so
// do the room's counters (writeCounters).
// (Both may send the same config; a client applies it twice to no effect.)
func (c *conn) afterLoginAck(r *localRoom, sent *clientpb.CdnConfig) {
	r.mu.Lock()
	c.cdnAcked = true
	now := r.cdnConfig()
	r.mu.Unlock()
	if !proto.Equal(now, sent) {
		if now == nil {
			now = &clientpb.CdnConfig{Mode: clientpb.CdnMode_CDN_MODE_OFF}
		}
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_CdnConfig{CdnConfig: now}})
	}
	// The room's counters, as the node has them now; later changes come with everyone's
	// (counters.go). One that comes between may arrive twice or before this one: a client keeps
	// the greatest version.
	if t := r.counters.Load(); len(t.GetCounters()) > 0 {
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_CounterTotals{CounterTotals: t}})
	}
	// And its viewer count as the node knows it (viewers.go).
	if v := r.viewers.Load(); v != nil && c.liveState {
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_ViewerCount{ViewerCount: v}})
	}
	// And, in CDN mode, the recalls of the last few seconds: the segment this client polls
	// first may hold a message recalled before it logged in (recall.go).
	if now.GetMode() != clientpb.CdnMode_CDN_MODE_OFF {
		if recent := r.recalls.recent(c.node.now()); len(recent) > 0 {
			c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Recall{Recall: &clientpb.Recall{Messages: recent}}})
		}
	}
	// And its attributes (attributes.go).
	if a := r.attrs.Load(); len(a.GetAttributes()) > 0 && c.liveState {
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_RoomAttributes{RoomAttributes: a}})
	}
}
