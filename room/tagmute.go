package room

import (
	"time"

	"roomcast/proto/apipb"
	"roomcast/store/roomstore"
	"roomcast/tag"
)

// tagMuted reports whether a member with tags and uid is muted in the room meta describes by one
// of its tag mutes (MuteRoom with a tag expression) at now. An expression that no longer
// compiles mutes no one: the server API compiled it before storing it.
func tagMuted(meta *apipb.Room, tags []string, uid string, now time.Time, exprs *tag.Cache) bool {
	for _, m := range meta.GetTagMutes() {
		if !roomstore.TagMuteHolds(m, now) {
			continue
		}
		if e, err := exprs.Get(m.TagExpr); err == nil && e.EvalTags(tags, uid) {
			return true
		}
	}
	return false
}
