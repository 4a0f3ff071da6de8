package room

import (
	"testing"
	"time"

	"roomcast/proto/apipb"
	"roomcast/tag"
)

// TestTagMuted: a tag mute stops the members its expression matches until its time, and one
// whose expression does not compile stops no one.
func TestTagMuted(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_800_000_000_000)
	meta := &apipb.Room{TagMutes: []*apipb.TagMute{
		{TagExpr: `"class:2" in tags`},
		{TagExpr: `role == "lecturer"`, UntilMs: now.UnixMilli() + 1000},
		{TagExpr: `len(tags) > 0`},
	}}
	exprs := tag.NewCache(8)
	cases := []struct {
		tags []string
		at   time.Time
		want bool
	}{
		{[]string{"class:2", "role:student"}, now, true},
		{[]string{"class:1", "role:student"}, now, false},
		{[]string{"role:lecturer"}, now, true},
		{[]string{"role:lecturer"}, now.Add(999 * time.Millisecond), true},
		{[]string{"role:lecturer"}, now.Add(time.Second), false},
		{nil, now, false},
	}
	for _, tc := range cases {
		if got := tagMuted(meta, tc.tags, "u", tc.at, exprs); got != tc.want {
			t.Errorf("%v at +%v: muted %v, want %v", tc.tags, tc.at.Sub(now), got, tc.want)
		}
	}
	if tagMuted(nil, []string{"class:2"}, "u", now, exprs) {
		t.Error("a room never created has no tag mutes")
	}
}
