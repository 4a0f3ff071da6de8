package presence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/bus"
	"roomcast/internal/devcluster"
	pb "roomcast/proto/roomcastpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOnlineCountFollowsLogins logs clients in through a ChatLink and watches the presence
// service's count rise and fall with them.
func TestOnlineCountFollowsLogins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Config{DataDir: t.TempDir(), ChatLinks: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, err := bus.Connect(c.NATSURL(), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	count := func() int64 {
		var rep pb.Reply
		if err := bus.Request(ctx, nc, bus.SubjectPresenceCount, &pb.JoinRequest{App: devcluster.App}, &rep); err != nil {
			t.Fatal(err)
		}
		return rep.GetRoom().GetOnline()
	}
	waitFor := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for got := count(); got != want; got = count() {
			if time.Now().After(deadline) {
				t.Fatalf("online %d, want %d", got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Events the service cannot parse are dropped, not fatal.
	if err := nc.Publish(bus.SubjectPresenceEvents, []byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	evs := &pb.SessionEvents{}
	for i := 0; i < 3; i++ {
		evs.Events = append(evs.Events, &pb.SessionEvent{Kind: pb.SessionEvent_KIND_LOGIN, App: devcluster.App, Uid: fmt.Sprint("u", i), SessionId: fmt.Sprint("x-", i)})
	}
	evs.Events = append(evs.Events, &pb.SessionEvent{Kind: pb.SessionEvent_KIND_LOGIN, App: "other", Uid: "u", SessionId: "y-1"})
	if err := bus.Publish(nc, bus.SubjectPresenceEvents, evs); err != nil {
		t.Fatal(err)
	}
	waitFor(3)
	if err := bus.Publish(nc, bus.SubjectPresenceEvents, &pb.SessionEvents{Events: []*pb.SessionEvent{{Kind: pb.SessionEvent_KIND_LOGOUT, SessionId: "x-1"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(2)
}
