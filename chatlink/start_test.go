package chatlink_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit/testcluster"
)

// watchReports returns a function that says which load and session reports have been
// published under node by a node other than the live one (whose session reports carry
// liveBoot and load reports liveURL; empty when there is none). The reports are received on a
// channel by the connection's reader itself, so after a Flush of nc every report published
// before it is there to be seen.
func watchReports(t *testing.T, nc *nats.Conn, node, liveBoot, liveURL string) (foreign func() []string) {
	t.Helper()
	ch := make(chan *nats.Msg, 4096)
	for _, subject := range []string{bus.SubjectLoad, bus.SubjectSessionsReport} {
		sub, err := nc.ChanSubscribe(subject, ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		var out []string
		for {
			select {
			case m := <-ch:
				var load buspb.LoadReport
				var sessions buspb.NodeReport
				switch {
				case m.Subject == bus.SubjectLoad && proto.Unmarshal(m.Data, &load) == nil && load.Node == node && load.WsUrl != liveURL,
					m.Subject == bus.SubjectSessionsReport && proto.Unmarshal(m.Data, &sessions) == nil && sessions.Node == node && sessions.Boot != liveBoot:
					out = append(out, m.Subject)
				}
			default:
				return out
			}
		}
	}
}

// liveBoot waits for a session report of node and returns its boot.
func liveBoot(t *testing.T, nc *nats.Conn, node string) string {
	t.Helper()
	sub, err := nc.SubscribeSync(bus.SubjectSessionsReport)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var r buspb.NodeReport
		if proto.Unmarshal(m.Data, &r) == nil && r.Node == node {
			return r.Boot
		}
	}
	t.Fatalf("no session report from %s", node)
	return ""
}

// TestStartFailureLeavesNothingBehind: a node that fails to start, because its TCP address is
// taken or because a live node holds its name, leaves nothing running: no goroutine, no
// subscription, no open listener, and it publishes no load or session report under its name,
// neither while starting nor when shut down afterwards.
func TestStartFailureLeavesNothingBehind(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	watcher, err := bus.Connect(c.NATSURL(), "report watcher", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	for _, tc := range []struct {
		name, node, tcp, err string
	}{
		{"tcp address taken", "cl-fail", taken.Addr().String(), "tcp listener"},
		{"name leased", c.Nodes[0].Name(), "", "is leased by another node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var boot, url string
			if tc.node == c.Nodes[0].Name() {
				boot, url = liveBoot(t, watcher, tc.node), c.Nodes[0].WSURL()
			}
			foreign := watchReports(t, watcher, tc.node, boot, url)
			nc, err := bus.Connect(c.NATSURL(), tc.node+" that fails", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// The connection's reply subscription, made by its first request, is the
			// connection's and outlives the node: make it before counting.
			_, _ = nc.Request("rc.test.nobody", nil, 100*time.Millisecond)
			subs := nc.NumSubscriptions()
			running := goleak.IgnoreCurrent()

			node, err := chatlink.New(chatlink.Config{
				Node: tc.node, Bus: nc, Keys: map[string][]byte{"demo": []byte("x")},
				TCPListen: tc.tcp, ReportInterval: 10 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := node.Start(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Start: %v, want an error about %q", err, tc.err)
			}
			goleak.VerifyNone(t, running)
			if got := nc.NumSubscriptions(); got != subs {
				t.Errorf("%d subscriptions left open", got-subs)
			}
			if wsAddr := strings.TrimSuffix(strings.TrimPrefix(node.WSURL(), "ws://"), "/v1/ws"); wsAddr != "" {
				if conn, err := net.DialTimeout("tcp", wsAddr, time.Second); err == nil {
					conn.Close()
					t.Error("the WebSocket listener is still open")
				}
			}
			if err := node.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown after a failed Start: %v", err)
			}
			// Whatever the node published went out before Start or Shutdown returned: a round
			// trip of each connection brings it to the watcher (and anything a goroutine left
			// running had published by then).
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := watcher.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := foreign(); len(got) > 0 {
				t.Fatalf("the node that failed to start published %d reports (%v, ...)", len(got), got[0])
			}
			goleak.VerifyNone(t, running)
		})
	}
}
