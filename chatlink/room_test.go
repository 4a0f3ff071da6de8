package chatlink

import "testing"

// TestClaimFresh: while a node has no member of a room, one login at a time asks for the
// room's settings fresh from the store.
func TestClaimFresh(t *testing.T) {
	t.Parallel()
	rt := newRoomTable(nil)
	if !rt.claimFresh("a", "r") {
		t.Fatal("first login of a room did not claim")
	}
	if rt.claimFresh("a", "r") {
		t.Fatal("a second login claimed while the first one's join is in flight")
	}
	if !rt.claimFresh("a", "other") {
		t.Fatal("another room's login did not claim")
	}
	rt.unclaimFresh("a", "r") // the first join failed
	if !rt.claimFresh("a", "r") {
		t.Fatal("the login after a failed claim did not claim")
	}
}
