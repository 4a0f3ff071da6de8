package room

import (
	"time"

	"roomcast/proto/apipb"
	"roomcast/tag"
)

// MaxTagMutes bounds the tag mutes a room holds: each member's send is checked against all of
// them.
const MaxTagMutes = 16

// TagMuteHolds reports whether a room's tag mute still holds at now.
func TagMuteHolds(m *apipb.TagMute, now time.Time) bool {
	return m.UntilMs == 0 || now.UnixMilli() < m.UntilMs
}

// tagMuted reports whether a member with tags and uid is muted in the room meta describes by one
// of its tag mutes (MuteRoom with a tag expression) at now. An expression that no longer
// compiles mutes no one: the server API compiled it before storing it.
func tagMuted(meta *apipb.Room, tags []string, uid string, now time.Time, exprs *tag.Cache) bool {
	for _, m := range meta.GetTagMutes() {
		if !TagMuteHolds(m, now) {
			continue
		}
		if e, err := exprs.Get(m.TagExpr); err == nil && e.EvalTags(tags, uid) {
			return true
		}
	}
	return false
}
