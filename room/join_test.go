package room

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// A room created through another instance a moment ago, which this instance's cache has not
// seen yet, admits logins: a cache miss is asked of the store before the login is refused.
// Found by TestReferenceDeployment (two service instances), which lost 3 of 4 probe logins to
// "room does not exist" on a loaded machine.
func TestJoinRoomMissingFromCache(t *testing.T) {
	t.Parallel()
	s, _, nc := startService(t, Config{RequireCreated: true})
	s.cache.stop() // the cache no longer follows the store: what it lacks, it lacks for good

	join := func(room string) *buspb.Reply {
		t.Helper()
		b, _ := proto.Marshal(&buspb.JoinRequest{App: "a", Room: room, Uid: "u1", Node: "n1"})
		m, err := nc.Request(bus.SubjectRoomJoin, b, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep buspb.Reply
		if err := proto.Unmarshal(m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return &rep
	}
	if ok, err := s.store.CreateRoom(context.Background(), "a", &apipb.Room{Room: "fresh"}); err != nil || !ok {
		t.Fatalf("create: %v %v", ok, err)
	}
	if rep := join("fresh"); rep.GetCode() != 0 {
		t.Errorf("join of a created room the cache has not seen: %v", rep)
	}
	if rep := join("never"); rep.GetCloseCode() != uint32(clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED) {
		t.Errorf("join of a room never created: %v, want close %d", rep, clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED)
	}
}
