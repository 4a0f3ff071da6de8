package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func dialCluster(t *testing.T, c *devcluster.Cluster, transport, uid, room string, cfg sdk.Config) *sdk.Client {
	t.Helper()
	// The tests send critical messages, which no budget thins: their members may.
	tok, err := c.Mint(uid, room, nil, time.Hour, auth.WithLanes(auth.LaneCritical))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Token = tok
	cfg.Dispatcher = c.URL()
	cfg.Transport = transport
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial %s: %v", uid, err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestClusterLogin(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	forEachTransport(t, func(t *testing.T, transport string) {
		cl := dialCluster(t, c, transport, "alice-"+transport, "lobby", sdk.Config{})
		ack := cl.LoginAck()
		if ack.GetUid() != "alice-"+transport || ack.GetRoom() != "lobby" || ack.GetApp() != devcluster.App {
			t.Errorf("LoginAck names %s/%s/%s", ack.GetApp(), ack.GetRoom(), ack.GetUid())
		}
		if ack.GetNode() == "" || !strings.HasPrefix(ack.GetSessionId(), ack.GetNode()) {
			t.Errorf("LoginAck session %q, node %q: the session id should start with the node", ack.GetSessionId(), ack.GetNode())
		}
		if ack.GetHeartbeatIntervalMs() == 0 {
			t.Error("LoginAck has no heartbeat interval")
		}
		if cl.Endpoint().Node != ack.GetNode() {
			t.Errorf("dialed %q but LoginAck says %q", cl.Endpoint().Node, ack.GetNode())
		}
	})
}

func TestClusterSendReceive(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	forEachTransport(t, func(t *testing.T, transport string) {
		room := "chat-" + transport
		bobGot := make(chan *clientpb.Message, 100)
		aliceGot := make(chan *clientpb.Message, 100)
		alice := dialCluster(t, c, transport, "alice", room, sdk.Config{OnMessage: func(m *clientpb.Message) { aliceGot <- m }})
		dialCluster(t, c, transport, "bob", room, sdk.Config{OnMessage: func(m *clientpb.Message) { bobGot <- m }})

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ack, err := alice.Send(ctx, sdk.Outgoing{Type: "chat", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("hello bob")})
		if err != nil {
			t.Fatal(err)
		}
		if len(ack.GetMessageId()) != 26 || ack.GetServerTimeMs() == 0 {
			t.Errorf("SendAck = %v", ack)
		}
		select {
		case m := <-bobGot:
			if string(m.GetBody()) != "hello bob" || m.GetSender() != "alice" || m.GetId() != ack.GetMessageId() ||
				m.GetType() != "chat" || m.GetRoom() != room {
				t.Errorf("bob got %v, want alice's message %s", m, ack.GetMessageId())
			}
		case <-time.After(5 * time.Second):
			t.Fatal("bob got nothing")
		}
		select {
		case m := <-aliceGot:
			t.Errorf("alice got an echo of %v", m)
		case <-time.After(100 * time.Millisecond):
		}

		_, err = alice.Send(ctx, sdk.Outgoing{Type: "chat"}) // empty body
		var se *sdk.SendError
		if !errors.As(err, &se) || se.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST) {
			t.Errorf("empty Send: err = %v, want *SendError %d", err, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST)
		}
		if alice.Err() != nil {
			t.Errorf("alice ended after a refused Send: %v", alice.Err())
		}
	})
}

func TestClusterBadToken(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	forEachTransport(t, func(t *testing.T, transport string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tok, err := c.Mint("mallory", "lobby", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		forged := tok[:len(tok)-4] + "AAAA"
		_, err = sdk.Dial(ctx, sdk.Config{Token: forged, Dispatcher: c.URL(), Transport: transport})
		var ce *sdk.CloseError
		if !errors.As(err, &ce) || ce.Code != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
			t.Errorf("Dial with a forged token: err = %v, want *CloseError 4001", err)
		}
	})
}

func TestClusterDeadEndpointFallsThrough(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	forEachTransport(t, func(t *testing.T, transport string) {
		tok, err := c.Mint("carol", "lobby", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		live := liveEndpoint(t, c, tok)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		ln.Close()
		cl, err := sdk.Dial(ctx, sdk.Config{
			Token:     tok,
			Transport: transport,
			Endpoints: []sdk.Endpoint{{Node: "dead", WSURL: "ws://" + dead + "/v1/ws", TCPAddr: dead}, live},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if cl.LoginAck().GetNode() != live.Node {
			t.Errorf("connected to %q, want %q", cl.LoginAck().GetNode(), live.Node)
		}
	})
}

// liveEndpoint asks the cluster's dispatcher for an endpoint, by dialing once.
func liveEndpoint(t *testing.T, c *devcluster.Cluster, tok string) sdk.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	return cl.Endpoint()
}

func TestClusterDialContextCanceled(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	tok, err := c.Mint("dave", "lobby", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL()}); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with a canceled context: err = %v, want context.Canceled", err)
	}
}

func TestClusterManyMessagesInOrder(t *testing.T) {
	t.Parallel()
	// One sender's 200 messages as fast as the acks come: more than a member's send limits
	// and the room's critical cap let through, which are not what this test is about.
	c := testcluster.Start(t, testcluster.ChatLinks(2), testcluster.NoMemberCriticalCap(), testcluster.NoSendLimits())
	forEachTransport(t, func(t *testing.T, transport string) {
		room := "order-" + transport
		got := make(chan *clientpb.Message, 1000)
		sender := dialCluster(t, c, transport, "sender", room, sdk.Config{})
		dialCluster(t, c, transport, "reader", room, sdk.Config{OnMessage: func(m *clientpb.Message) { got <- m }})
		const n = 200
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i := range n {
			if _, err := sender.Send(ctx, sdk.Outgoing{Type: "chat", Lane: clientpb.Lane_LANE_CRITICAL, Body: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatalf("Send %d: %v", i, err)
			}
		}
		var last string
		for i := range n {
			select {
			case m := <-got:
				if m.GetId() <= last {
					t.Errorf("message %d id %s not after %s", i, m.GetId(), last)
				}
				last = m.GetId()
			case <-time.After(5 * time.Second):
				t.Fatalf("got %d of %d messages", i, n)
			}
		}
	})
}

// Not parallel: it counts the process's goroutines.
func TestClusterCloseNoLeaks(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	session := func(t *testing.T, transport string) *sdk.Client {
		tok, err := c.Mint("erin", "lobby", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := sdk.Dial(context.Background(), sdk.Config{Token: tok, Dispatcher: c.URL(), Transport: transport})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Send(context.Background(), sdk.Outgoing{Body: []byte("bye")}); err != nil {
			t.Fatal(err)
		}
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	// The first session makes the servers start what they keep for good (NATS reply
	// subscriptions, among them the room service's for its history writes, which follow the
	// send by a batch window): not a leak.
	session(t, sdk.TransportTCP)
	historyHas(t, c, "lobby", 1)
	forEachTransport(t, func(t *testing.T, transport string) {
		before := goleak.IgnoreCurrent()
		cl := session(t, transport)
		select {
		case <-cl.Done():
		default:
			t.Error("Done not closed after Close")
		}
		if !errors.Is(cl.Err(), sdk.ErrClosed) {
			t.Errorf("Err = %v, want ErrClosed", cl.Err())
		}
		// Both the client's goroutines and the ChatLink's for this connection must be gone.
		// A ChatLink reader that read for it and now waits for another connection's read is not
		// the connection's: the node keeps it for up to a second (chatlink/polled.go), longer on
		// a busy machine; one still reading has another function on top.
		goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("roomcast/chatlink.(*Node).reader"))
	})
}

// TestClusterShutdownSurfaces: a ChatLink that shuts down closes its clients with a transient
// code; a Client without reconnecting stops with it.
func TestClusterShutdownSurfaces(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	rec := newRecorder()
	cl := dialCluster(t, c, sdk.TransportWebSocket, "frank", "lobby", rec.config(sdk.Config{NoReconnect: true}))
	c.Close()
	err := rec.waitClosed(t, 10*time.Second)
	var ce *sdk.CloseError
	if !errors.As(err, &ce) || ce.Terminal() {
		t.Errorf("after cluster shutdown: err = %v, want a transient *CloseError", err)
	}
	t.Logf("close after shutdown: %v; events %q", err, rec.order())
	select {
	case <-cl.Done():
	default:
		t.Error("Done not closed")
	}
}

// TestClusterCustomDialer checks that Config.Dialer opens the ChatLink connection for both
// transports, and that a client can choose its local address with it (as roomcast bench does
// to spread many clients over loopback source addresses).
func TestClusterCustomDialer(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	forEachTransport(t, func(t *testing.T, transport string) {
		var mu sync.Mutex
		var dialed []string
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		cl := dialCluster(t, c, transport, "dialer-"+transport, "lobby", sdk.Config{
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				nc, err := d.DialContext(ctx, network, addr)
				if err == nil {
					mu.Lock()
					dialed = append(dialed, nc.LocalAddr().String())
					mu.Unlock()
				}
				return nc, err
			},
		})
		mu.Lock()
		defer mu.Unlock()
		if len(dialed) != 1 || !strings.HasPrefix(dialed[0], "127.0.0.2:") {
			t.Errorf("dialer opened %q, want one connection from 127.0.0.2", dialed)
		}
		if cl.LoginAck().GetSessionId() == "" {
			t.Error("no session over the custom dialer")
		}
	})
	t.Run("error", func(t *testing.T) {
		tok, err := c.Mint("dialer-fail", "lobby", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("no route for this test")
		_, err = sdk.Dial(context.Background(), sdk.Config{
			Token: tok, Dispatcher: c.URL(),
			Dialer: func(context.Context, string, string) (net.Conn, error) { return nil, boom },
		})
		if !errors.Is(err, boom) {
			t.Errorf("Dial = %v, want the dialer's error", err)
		}
	})
}

// TestClusterCriticalNotAllowed: a member whose token does not grant the critical lane, in a
// room that does not allow it, is refused with ErrLaneNotAllowed (123) and may send on the
// normal lane.
func TestClusterCriticalNotAllowed(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	tok, err := c.Mint("plain", "lanes", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.Send(ctx, sdk.Outgoing{Type: "chat", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("hi")})
	var se *sdk.SendError
	if !errors.Is(err, sdk.ErrLaneNotAllowed) || !errors.As(err, &se) || se.Temporary() {
		t.Fatalf("a member's critical send: err %v, want ErrLaneNotAllowed, not temporary", err)
	}
	if _, err := cl.Send(ctx, sdk.Outgoing{Type: "chat", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte("hi")}); err != nil {
		t.Fatalf("the same on the normal lane: %v", err)
	}
}
