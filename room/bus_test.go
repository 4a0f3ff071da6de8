package room_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// outMsgs is how many messages the NATS server has sent on the named client connection.
func outMsgs(t *testing.T, ns *server.Server, name string) int64 {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == name {
			return c.OutMsgs
		}
	}
	t.Fatalf("no NATS connection named %q", name)
	return 0
}

// A room receiving 1,000 critical messages a second reaches its node as at most 60 bus messages
// a second with a 20 ms window, as the NATS server counts them on the node's connection, and the
// member receives every one, numbered 1, 2, 3, ... in order.
func TestBusMessagesPerNodeStayFlat(t *testing.T) {
	t.Parallel()
	seconds := 3
	if testing.Short() {
		seconds = 1
	}
	const rate = 1000
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.Room.BatchWindow = 20 * time.Millisecond
	})
	node := c.Nodes[0]
	cl := testkit.DialTCP(t, node.TCPAddr())
	if ack := cl.Login(testcluster.Token(t, "viewer", "busy")); ack == nil {
		t.Fatal("no login ack")
	}
	senders := make([]*nats.Conn, 10)
	for i := range senders {
		nc, err := nats.Connect(c.NATSURL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		senders[i] = nc
	}
	conn := "chatlink " + node.Name()
	before := outMsgs(t, c.NATS, conn)
	start := time.Now()
	n := rate * seconds
	var wg sync.WaitGroup
	per := n / len(senders)
	for i, nc := range senders {
		wg.Go(func() {
			tick := time.NewTicker(time.Second * time.Duration(len(senders)) / rate)
			defer tick.Stop()
			for j := range per {
				<-tick.C
				req := &buspb.SendRequest{App: devcluster.App, Room: "busy", Lane: clientpb.Lane_LANE_CRITICAL, Body: fmt.Appendf(nil, "%d-%d", i, j)}
				var rep buspb.Reply
				if err := bus.Request(context.Background(), nc, bus.SubjectRoomSend, req, &rep); err != nil || rep.Code != 0 {
					t.Errorf("send: %v %v", err, &rep)
					return
				}
			}
		})
	}
	wg.Wait()
	msgs, _ := cl.CollectPushes(n)
	elapsed := time.Since(start)
	busMsgs := outMsgs(t, c.NATS, conn) - before
	for i, m := range msgs {
		if m.RoomSeq != uint64(i+1) {
			t.Fatalf("message %d has room_seq %d: lost or out of order", i, m.RoomSeq)
		}
	}
	perSecond := float64(busMsgs) / elapsed.Seconds()
	t.Logf("%d messages in %v: %d bus messages to the node, %.1f/s", n, elapsed, busMsgs, perSecond)
	if perSecond > 60 {
		t.Errorf("%.1f bus messages per second to the node (%d in %v), want at most 60", perSecond, busMsgs, elapsed)
	}
}
