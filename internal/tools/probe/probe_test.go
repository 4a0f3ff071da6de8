package probe_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/internal/tools/probe"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startCluster(t *testing.T, chatLinks int) *devcluster.Cluster {
	t.Helper()
	return testcluster.Start(t, testcluster.ChatLinks(chatLinks))
}

func TestProbeCluster(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2)
	for _, transport := range []string{sdk.TransportWebSocket, sdk.TransportTCP} {
		t.Run(transport, func(t *testing.T) {
			res, err := probe.Run(context.Background(), probe.Config{
				Dispatcher: c.URL(),
				Secret:     []byte(devcluster.Secret),
				Room:       "probe-" + transport,
				Clients:    4,
				Messages:   10,
				Transport:  transport,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if !res.OK() || res.Delivered != 4*3*10 || res.Acked != 40 || res.Clients != 4 || res.Nodes < 1 {
				t.Errorf("probe failed on a healthy cluster: %v %q", res, res.Errors)
			}
			if res.P50 <= 0 || res.P99 < res.P50 || res.Max < res.P99 {
				t.Errorf("latencies p50=%v p99=%v max=%v", res.P50, res.P99, res.Max)
			}
		})
	}
}

func TestProbeBadSecret(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 1)
	res, err := probe.Run(context.Background(), probe.Config{
		Dispatcher: c.URL(), Secret: []byte("wrong"), Clients: 2, Messages: 1,
	})
	var ce *sdk.CloseError
	if !errors.As(err, &ce) || ce.Code != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
		t.Errorf("err = %v, want a 4001 *CloseError", err)
	}
	if res.OK() {
		t.Errorf("result %v is OK with a wrong secret", res)
	}
}

func TestProbeConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  probe.Config
	}{
		{"no dispatcher", probe.Config{Secret: []byte("s")}},
		{"no secret", probe.Config{Dispatcher: "http://x"}},
		{"one client", probe.Config{Dispatcher: "http://x", Secret: []byte("s"), Clients: 1}},
		{"no messages", probe.Config{Dispatcher: "http://x", Secret: []byte("s"), Messages: -1}},
		{"bad transport", probe.Config{Dispatcher: "http://x", Secret: []byte("s"), Transport: "udp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := probe.Run(context.Background(), tc.cfg); err == nil {
				t.Error("Run accepted a bad Config")
			}
		})
	}
}

// TestProbeCountsFaults runs the probe against a broken fake ChatLink that sends every message
// back to its sender, twice to everyone else, and drops every third message: the probe must
// see all of it.
func TestProbeCountsFaults(t *testing.T) {
	t.Parallel()
	link := startBrokenLink(t)
	res, err := probe.Run(context.Background(), probe.Config{
		Dispatcher: link.dispatcherURL, Secret: []byte("s"), Clients: 3, Messages: 3, Transport: sdk.TransportTCP,
		Timeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	// 9 messages, each to 2 receivers; messages 0..8 in order of arrival, every third dropped.
	if res.OK() {
		t.Error("result OK from a broken server")
	}
	if res.Expected != 18 || res.Delivered != 12 || res.Lost != 6 || res.Dup != 12 || res.Echo != 9 || res.Acked != 9 {
		t.Errorf("got %+v, want expected=18 delivered=12 lost=6 dup=12 echo=9 acked=9", res)
	}
	if !strings.Contains(res.String(), "lost=6") {
		t.Errorf("summary %q does not show the loss", res)
	}
}

// brokenLink is a fake dispatcher plus a one-room TCP ChatLink with the faults described above.
type brokenLink struct {
	dispatcherURL string
	ln            net.Listener
	wg            sync.WaitGroup
	mu            sync.Mutex // guards the fields below
	conns         map[*brokenConn]bool
	count         int
}

type brokenConn struct {
	nc  net.Conn
	wmu sync.Mutex
}

func startBrokenLink(t *testing.T) *brokenLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &brokenLink{ln: ln, conns: map[*brokenConn]bool{}}
	d := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"nodes":  []sdk.Endpoint{{Node: "broken", TCPAddr: ln.Addr().String()}},
			"ttl_ms": 1000,
		})
	}))
	l.dispatcherURL = d.URL
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(func() {
		d.Close()
		ln.Close()
		l.mu.Lock()
		for c := range l.conns {
			c.nc.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

func (l *brokenLink) accept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		c := &brokenConn{nc: nc}
		l.mu.Lock()
		l.conns[c] = true
		l.mu.Unlock()
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.serve(c)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			nc.Close()
		}()
	}
}

func (l *brokenLink) serve(c *brokenConn) {
	br := bufio.NewReader(c.nc)
	for {
		f, err := testkit.ReadFrame(br)
		if err != nil {
			return
		}
		switch k := f.Kind.(type) {
		case *clientpb.Frame_Login:
			c.send(&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{
				SessionId: "broken-1", HeartbeatIntervalMs: 60000, Node: "broken",
			}}})
		case *clientpb.Frame_Send:
			l.mu.Lock()
			n := l.count
			l.count++
			var all []*brokenConn
			for o := range l.conns {
				all = append(all, o)
			}
			l.mu.Unlock()
			msg := &clientpb.Message{Id: "m", Type: k.Send.GetType(), Lane: k.Send.GetLane(), Body: k.Send.GetBody()}
			for _, o := range all {
				switch {
				case o == c: // echo to the sender
					o.send(pushOf(msg))
				case n%3 == 2: // lose
				default: // deliver twice
					o.send(pushOf(msg, msg))
				}
			}
			c.send(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{Seq: k.Send.GetSeq(), MessageId: "m"}}})
		}
	}
}

func pushOf(msgs ...*clientpb.Message) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: msgs}}}
}

func (c *brokenConn) send(f *clientpb.Frame) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = testkit.WriteFrame(c.nc, f)
}
