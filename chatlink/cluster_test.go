package chatlink_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lxzan/gws"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/clustertest"
	"roomcast/internal/devcluster"
	"roomcast/internal/testutil"
	pb "roomcast/proto/roomcastpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startCluster starts NATS, the services, the dispatcher and n ChatLinks in this process and
// stops them when the test ends.
func startCluster(t *testing.T, n int, opts ...func(*devcluster.Config)) *devcluster.Cluster {
	t.Helper()
	return clustertest.Start(t, append([]func(*devcluster.Config){clustertest.ChatLinks(n)}, opts...)...)
}

// checkFor polls f until it returns nil or the time is up.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	testutil.CheckFor(t, total, every, f)
}

// withClock runs every ChatLink of a cluster on clock (Config.Now).
func withClock(clock *testutil.Clock) func(*devcluster.Config) {
	return func(cfg *devcluster.Config) {
		prev := cfg.ChatLink
		cfg.ChatLink = func(cc *chatlink.Config) {
			if prev != nil {
				prev(cc)
			}
			cc.Now = clock.Now
		}
	}
}

// rawClient speaks the wire protocol by hand, so tests can send what no SDK would.
type rawClient struct {
	t      *testing.T
	frames chan *pb.Frame
	closed chan uint16 // the close code: WebSocket close code, or 0 when TCP just ends
	send   func(b []byte) error
	ping   func() error // a WebSocket ping (dialWS only)
	stop   func()
	// pause, held, stops the TCP reader between frames, so the socket fills (dialTCP).
	pause sync.Mutex
}

type wsEvents struct {
	gws.BuiltinEventHandler
	c *rawClient
}

func (h wsEvents) OnMessage(_ *gws.Conn, m *gws.Message) {
	defer m.Close()
	var f pb.Frame
	if err := proto.Unmarshal(m.Bytes(), &f); err != nil {
		h.c.t.Errorf("server sent a frame that does not parse: %v", err)
		return
	}
	h.c.frames <- &f
}

func (h wsEvents) OnClose(_ *gws.Conn, err error) {
	var ce *gws.CloseError
	if errors.As(err, &ce) {
		h.c.closed <- ce.Code
		return
	}
	h.c.closed <- 0
}

func dialWS(t *testing.T, url string) *rawClient {
	t.Helper()
	c := &rawClient{t: t, frames: make(chan *pb.Frame, 1024), closed: make(chan uint16, 1)}
	socket, _, err := gws.NewClient(wsEvents{c: c}, &gws.ClientOption{Addr: url})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	done := make(chan struct{})
	go func() { defer close(done); socket.ReadLoop() }()
	c.send = func(b []byte) error { return socket.WriteMessage(gws.OpcodeBinary, b) }
	c.ping = func() error { return socket.WritePing(nil) }
	c.stop = func() { _ = socket.NetConn().Close(); <-done }
	t.Cleanup(c.stop)
	return c
}

func dialTCP(t *testing.T, addr string) (*rawClient, net.Conn) {
	t.Helper()
	return dialTCPWith(t, addr, &net.Dialer{})
}

func dialTCPWith(t *testing.T, addr string, d *net.Dialer) (*rawClient, net.Conn) {
	t.Helper()
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &rawClient{t: t, frames: make(chan *pb.Frame, 1024), closed: make(chan uint16, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		br := bufio.NewReader(nc)
		var hdr [4]byte
		for {
			c.pause.Lock()
			//lint:ignore SA2001 an empty critical section on purpose: it waits while the test pauses the reader
			c.pause.Unlock()
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				c.closed <- 0
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, b); err != nil {
				c.closed <- 0
				return
			}
			var f pb.Frame
			if err := proto.Unmarshal(b, &f); err != nil {
				t.Errorf("server sent a frame that does not parse: %v", err)
				continue
			}
			c.frames <- &f
		}
	}()
	c.send = func(b []byte) error {
		_, err := nc.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
		if err == nil {
			_, err = nc.Write(b)
		}
		return err
	}
	c.stop = func() { _ = nc.Close(); <-done }
	t.Cleanup(c.stop)
	return c, nc
}

func (c *rawClient) sendFrame(f *pb.Frame) {
	c.t.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.send(b); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

func (c *rawClient) login(token string) *pb.LoginAck {
	c.t.Helper()
	c.sendFrame(&pb.Frame{Kind: &pb.Frame_Login{Login: &pb.Login{Token: token, Device: "test"}}})
	f := c.next()
	ack := f.GetLoginAck()
	if ack == nil {
		c.t.Fatalf("login answered with %v", f)
	}
	return ack
}

// next returns the next frame from the server, failing the test after 5s.
func (c *rawClient) next() *pb.Frame {
	c.t.Helper()
	select {
	case f := <-c.frames:
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatal("no frame from the server in 5s")
		return nil
	}
}

// expectKick waits for a Kick with code and then for the connection to close; over WebSocket
// the close frame must carry the same code.
func (c *rawClient) expectKick(code pb.CloseCode, ws bool) {
	c.t.Helper()
	f := c.next()
	if f.GetKick() == nil || f.GetKick().Code != uint32(code) {
		c.t.Fatalf("want Kick %v, got %v", code, f)
	}
	c.expectClose(map[bool]uint16{true: uint16(code), false: 0}[ws])
}

func (c *rawClient) expectClose(code uint16) {
	c.t.Helper()
	select {
	case got := <-c.closed:
		if got != code {
			c.t.Fatalf("closed with %d, want %d", got, code)
		}
	case <-time.After(5 * time.Second):
		c.t.Fatalf("connection not closed in 5s (want code %d)", code)
	}
}

// expectSilence fails if a frame arrives within d.
func (c *rawClient) expectSilence(d time.Duration) {
	c.t.Helper()
	select {
	case f := <-c.frames:
		c.t.Fatalf("unexpected frame %v", f)
	case <-time.After(d):
	}
}

func token(t *testing.T, c *devcluster.Cluster, uid, room string) string {
	t.Helper()
	tok, err := c.Mint(uid, room, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func sendFrame(seq uint64, body string) *pb.Frame {
	return &pb.Frame{Kind: &pb.Frame_Send{Send: &pb.Send{Seq: seq, Type: "chat", Lane: pb.Lane_LANE_NORMAL, Body: []byte(body)}}}
}

// roomSubscribers returns the names of the NATS connections subscribed to a room's subject.
func roomSubscribers(t *testing.T, s *server.Server, room string) map[string]bool {
	t.Helper()
	cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, ci := range cz.Conns {
		for _, sub := range ci.Subs {
			if sub == "rc.room."+devcluster.App+"."+room {
				out[ci.Name] = true
			}
		}
	}
	return out
}

func TestCrossNodeDelivery(t *testing.T) {
	c := startCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]

	alice := dialWS(t, n1.WSURL())
	aliceAck := alice.login(token(t, c, "alice", "r1"))
	bob, _ := dialTCP(t, n2.TCPAddr())
	bob.login(token(t, c, "bob", "r1"))
	carol := dialWS(t, n1.WSURL())
	carol.login(token(t, c, "carol", "r1"))
	dave := dialWS(t, n2.WSURL()) // another room on node 2
	dave.login(token(t, c, "dave", "r2"))
	if aliceAck.Node != "cl-1" || !strings.HasPrefix(aliceAck.SessionId, "cl-1-") {
		t.Fatalf("login ack names node %q, session %q", aliceAck.Node, aliceAck.SessionId)
	}

	alice.sendFrame(sendFrame(7, "hello from node 1"))
	ack := alice.next().GetSendAck()
	if ack == nil || ack.Seq != 7 || len(ack.MessageId) != 26 {
		t.Fatalf("want SendAck for seq 7 with a message id, got %v", ack)
	}
	for _, who := range []*rawClient{bob, carol} {
		msgs := who.next().GetPush().GetMessages()
		if len(msgs) != 1 || string(msgs[0].Body) != "hello from node 1" || msgs[0].Sender != "alice" || msgs[0].Id != ack.MessageId {
			t.Fatalf("want alice's message, got %v", msgs)
		}
	}
	alice.expectSilence(200 * time.Millisecond) // no echo to the sender
	dave.expectSilence(0)

	bob.sendFrame(sendFrame(1, "hello from node 2"))
	if bob.next().GetSendAck() == nil {
		t.Fatal("bob's send not acknowledged")
	}
	for _, who := range []*rawClient{alice, carol} {
		if msgs := who.next().GetPush().GetMessages(); len(msgs) != 1 || msgs[0].Sender != "bob" {
			t.Fatalf("want bob's message, got %v", msgs)
		}
	}
	dave.expectSilence(100 * time.Millisecond)

	// Room r2 has members only on node 2: node 1 has no interest in it, so NATS sends it nothing.
	subs := roomSubscribers(t, c.NATS, "r2")
	if !subs["chatlink cl-2"] || subs["chatlink cl-1"] {
		t.Fatalf("subscribers of r2: %v, want only chatlink cl-2", subs)
	}
	// When its last member leaves, a node drops the room's subscription.
	dave.stop()
	checkFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if subs := roomSubscribers(t, c.NATS, "r2"); len(subs) != 0 {
			return fmt.Errorf("r2 still has subscribers %v", subs)
		}
		return nil
	})
}

func TestServerAPISendReachesBothNodes(t *testing.T) {
	c := startCluster(t, 2)
	a := dialWS(t, c.Nodes[0].WSURL())
	a.login(token(t, c, "a", "lobby"))
	b := dialWS(t, c.Nodes[1].WSURL())
	b.login(token(t, c, "b", "lobby"))

	req, _ := http.NewRequest("POST", c.URL()+"/v1/rooms/lobby/messages", strings.NewReader(`{"type":"notice","lane":"critical","body":"doors open"}`))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("send: HTTP %d", resp.StatusCode)
	}
	for _, who := range []*rawClient{a, b} {
		msgs := who.next().GetPush().GetMessages()
		if len(msgs) != 1 || string(msgs[0].Body) != "doors open" || msgs[0].Lane != pb.Lane_LANE_CRITICAL || msgs[0].Sender != "" {
			t.Fatalf("want the notice, got %v", msgs)
		}
	}
}

// dialWSText opens a WebSocket and sends one text message.
func dialWSText(t *testing.T, url string) *rawClient {
	t.Helper()
	c := &rawClient{t: t, frames: make(chan *pb.Frame, 16), closed: make(chan uint16, 1)}
	socket, _, err := gws.NewClient(wsEvents{c: c}, &gws.ClientOption{Addr: url})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	done := make(chan struct{})
	go func() { defer close(done); socket.ReadLoop() }()
	t.Cleanup(func() { _ = socket.NetConn().Close(); <-done })
	if err := socket.WriteString("hello?"); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPipelinedSendsKeepOrder(t *testing.T) {
	c := startCluster(t, 2)
	sender := dialWS(t, c.Nodes[0].WSURL())
	sender.login(token(t, c, "fast", "order"))
	receiver := dialTCP2(t, c.Nodes[1].TCPAddr())
	receiver.login(token(t, c, "reader", "order"))

	const n = 30
	for i := 1; i <= n; i++ { // no waiting for acks; critical, so no budget thins them
		f := sendFrame(uint64(i), fmt.Sprint(i))
		f.GetSend().Lane = pb.Lane_LANE_CRITICAL
		sender.sendFrame(f)
	}
	var lastID string
	for i := 1; i <= n; i++ {
		ack := sender.next().GetSendAck()
		if ack == nil || ack.Seq != uint64(i) || ack.MessageId <= lastID {
			t.Fatalf("ack %d: %v (previous id %s)", i, ack, lastID)
		}
		lastID = ack.MessageId
	}
	for got := 0; got < n; {
		for _, m := range receiver.next().GetPush().GetMessages() {
			got++
			if string(m.Body) != fmt.Sprint(got) {
				t.Fatalf("message %d has body %q: out of order", got, m.Body)
			}
		}
	}
}
