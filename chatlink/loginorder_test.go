package chatlink_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// TestLoginAckBeforePush: members log in to an unmerged room (every batch written at once)
// whose batches come every 200µs or so; the first frame each gets is its LoginAck, never a
// Push of the room.
func TestLoginAckBeforePush(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	const room = "busy"
	testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey, `{"room":"`+room+`","settings":{"no_merge":true}}`, nil)
	first := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	first.Login(testcluster.Token(t, "first", room)) // the node subscribes to the room

	nc := testkit.Connect(t, c.NATS)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = bus.Publish(nc, bus.RoomSubject(devcluster.App, room), &buspb.RoomBatch{Messages: []*clientpb.Message{{Id: "x", Room: room, Lane: clientpb.Lane_LANE_BULK}}})
			time.Sleep(200 * time.Microsecond)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// Logins side by side, as in a reconnect wave: each is a chance for a batch to come
	// between the member joining the room and its LoginAck.
	var logins sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		logins.Go(func() {
			for i := range 100 {
				m := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
				f := m.LoginAs(testcluster.Token(t, fmt.Sprintf("u%d-%d", w, i), room), "test")
				m.Close()
				if f.GetLoginAck() == nil {
					errs <- fmt.Errorf("login %d-%d: first frame %v, want the LoginAck", w, i, f)
					return
				}
			}
		})
	}
	logins.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
