package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeServerEnv) != "" {
		os.Exit(serveFakeProcess())
	}
	goleak.VerifyTestMain(m)
}

var transports = []string{sdk.TransportWebSocket, sdk.TransportTCP}

// forEachTransport runs f as a subtest for each transport.
func forEachTransport(t *testing.T, f func(t *testing.T, transport string)) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { f(t, tr) })
	}
}

func dialFake(t *testing.T, transport string, cfg sdk.Config, links ...*fakeLink) (*sdk.Client, error) {
	t.Helper()
	cfg.Token = "not-checked-by-the-fake"
	cfg.Transport = transport
	for i, l := range links {
		cfg.Endpoints = append(cfg.Endpoints, l.endpoint("cl-"+string(rune('1'+i))))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return sdk.Dial(ctx, cfg)
}

func TestFakeLoginSendAndPush(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		var login atomic.Pointer[clientpb.Login]
		link := startFakeLink(t, func(c fakeConn) {
			l, err := acceptLogin(c, "cl-1", time.Minute)
			if err != nil {
				return
			}
			login.Store(l)
			_ = c.send(pushFrame(
				&clientpb.Message{Id: "a", Sender: "u2", Body: []byte("one")},
				&clientpb.Message{Id: "b", Sender: "u2", Body: []byte("two")},
			))
			answerLoop(c)
		})
		got := make(chan *clientpb.Message, 10)
		c, err := dialFake(t, transport, sdk.Config{Device: "test", OnMessage: func(m *clientpb.Message) { got <- m }}, link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if ack := c.LoginAck(); ack.GetNode() != "cl-1" || ack.GetSessionId() != "cl-1-s1" {
			t.Errorf("LoginAck = %v", ack)
		}
		for _, want := range []string{"one", "two"} {
			select {
			case m := <-got:
				if string(m.GetBody()) != want {
					t.Errorf("message body %q, want %q", m.GetBody(), want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no message %q", want)
			}
		}
		// The fake stored the Login before it pushed.
		if l := login.Load(); l.GetClient() != sdk.ClientName || l.GetDevice() != "test" || l.GetToken() == "" {
			t.Errorf("Login = %v", l)
		}

		ack, err := c.Send(context.Background(), sdk.Outgoing{Type: "chat", Body: []byte("hi")})
		if err != nil {
			t.Fatal(err)
		}
		if ack.GetSeq() == 0 || ack.GetMessageId() == "" {
			t.Errorf("SendAck = %v", ack)
		}
		_, err = c.Send(context.Background(), sdk.Outgoing{Type: "chat", Body: []byte("refuse")})
		var se *sdk.SendError
		if !errors.As(err, &se) || se.Code != 102 || !se.Temporary() {
			t.Errorf("Send refused: err = %v, want *SendError 102", err)
		}
		if c.Err() != nil {
			t.Errorf("Err after a refused Send = %v, want nil", c.Err())
		}
	})
}

func TestFakeTerminalCloseStopsDial(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		bad := startFakeLink(t, func(c fakeConn) {
			_, _ = c.recv()
			c.kick(4001, "bad token")
		})
		good := startFakeLink(t, serveBasic("cl-2", time.Minute))
		_, err := dialFake(t, transport, sdk.Config{}, bad, good)
		var ce *sdk.CloseError
		if !errors.As(err, &ce) || ce.Code != 4001 || !ce.Terminal() {
			t.Fatalf("Dial err = %v, want *CloseError 4001", err)
		}
		if n := len(good.accepted); n != 0 {
			t.Errorf("the second endpoint got %d connections after a terminal close, want 0", n)
		}
	})
}

func TestFakeTransientCloseTriesNext(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		busy := startFakeLink(t, func(c fakeConn) {
			_, _ = c.recv()
			c.kick(4504, "presence unavailable")
		})
		good := startFakeLink(t, serveBasic("cl-2", time.Minute))
		c, err := dialFake(t, transport, sdk.Config{}, busy, good)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.LoginAck().GetNode() != "cl-2" || c.Endpoint().Node != "cl-2" {
			t.Errorf("connected to %q, want cl-2", c.LoginAck().GetNode())
		}
	})
}

func TestFakeDeadEndpointFallsThrough(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		ln.Close()
		good := startFakeLink(t, serveBasic("cl-2", time.Minute))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := sdk.Dial(ctx, sdk.Config{
			Token:     "x",
			Transport: transport,
			Endpoints: []sdk.Endpoint{{Node: "dead", WSURL: "ws://" + dead + "/v1/ws", TCPAddr: dead}, good.endpoint("cl-2")},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.LoginAck().GetNode() != "cl-2" {
			t.Errorf("connected to %q, want cl-2", c.LoginAck().GetNode())
		}
	})
}

func TestFakeAttemptTimeoutFallsThrough(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		silent := startFakeLink(t, func(c fakeConn) {
			for { // never answer the login
				if _, err := c.recv(); err != nil {
					return
				}
			}
		})
		good := startFakeLink(t, serveBasic("cl-2", time.Minute))
		c, err := dialFake(t, transport, sdk.Config{AttemptTimeout: 200 * time.Millisecond}, silent, good)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.LoginAck().GetNode() != "cl-2" {
			t.Errorf("connected to %q, want cl-2", c.LoginAck().GetNode())
		}
	})
}

func TestFakeDialContextCanceled(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		silent := startFakeLink(t, func(c fakeConn) {
			for {
				if _, err := c.recv(); err != nil {
					return
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-silent.accepted
			cancel()
		}()
		start := time.Now()
		_, err := sdk.Dial(ctx, sdk.Config{Token: "x", Transport: transport, Endpoints: []sdk.Endpoint{silent.endpoint("cl-1")}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Dial took %v after cancel", d)
		}
	})
}

func TestFakeHeartbeat(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		beats := make(chan struct{}, 100)
		link := startFakeLink(t, func(c fakeConn) {
			// Intervals long enough that a loaded machine does not make the server look dead
			// (three intervals without a frame), short enough for a quick test.
			if _, err := acceptLogin(c, "cl-1", 100*time.Millisecond); err != nil {
				return
			}
			for {
				f, err := c.recv()
				if err != nil {
					return
				}
				if hb := f.GetHeartbeat(); hb != nil {
					beats <- struct{}{}
					_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_HeartbeatAck{HeartbeatAck: &clientpb.HeartbeatAck{
						ClientTimeMs: hb.GetClientTimeMs(), HeartbeatIntervalMs: 80,
					}}})
				}
			}
		})
		c, err := dialFake(t, transport, sdk.Config{}, link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range 5 {
			select {
			case <-beats:
			case <-time.After(2 * time.Second):
				t.Fatalf("heartbeat %d did not arrive", i+1)
			}
		}
		if err := c.Err(); err != nil {
			t.Fatalf("client ended while heartbeats were answered: %v", err)
		}
	})
}

func TestFakeServerSilenceEndsClient(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		link := startFakeLink(t, func(c fakeConn) {
			if _, err := acceptLogin(c, "cl-1", 40*time.Millisecond); err != nil {
				return
			}
			for { // read heartbeats, answer nothing
				if _, err := c.recv(); err != nil {
					return
				}
			}
		})
		rec := newRecorder()
		c, err := dialFake(t, transport, rec.config(sdk.Config{NoReconnect: true}), link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case <-c.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("client did not notice the silent server")
		}
		if !errors.Is(c.Err(), sdk.ErrServerTimeout) {
			t.Errorf("Err = %v, want ErrServerTimeout", c.Err())
		}
		if err := rec.waitClosed(t, time.Second); !errors.Is(err, sdk.ErrServerTimeout) {
			t.Errorf("closed event: %v, want ErrServerTimeout", err)
		}
	})
}

func TestFakeKickAfterLogin(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		link := startFakeLink(t, func(c fakeConn) {
			if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
				return
			}
			_ = c.send(pushFrame(&clientpb.Message{Id: "a", Body: []byte("before kick")}))
			c.kick(4007, "kicked by app")
		})
		rec := newRecorder()
		c, err := dialFake(t, transport, rec.config(sdk.Config{}), link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rec.waitClosed(t, 3*time.Second) // 4007 is terminal: no reconnect
		var ce *sdk.CloseError
		if !errors.As(c.Err(), &ce) || ce.Code != 4007 || ce.Reason != "kicked by app" {
			t.Errorf("Err = %v, want *CloseError 4007", c.Err())
		}
		if got := fmt.Sprint(rec.order()); got != "[connected before kick kicked closed]" {
			t.Errorf("callbacks ran as %s, want [connected before kick kicked closed]", got)
		}
		if k := all[*sdk.KickedEvent](rec); len(k) != 1 || k[0].Code != 4007 || !k[0].Terminal {
			t.Errorf("kicked events %+v, want one terminal 4007", k)
		}
		if _, err := c.Send(context.Background(), sdk.Outgoing{Body: []byte("x")}); !errors.As(err, &ce) {
			t.Errorf("Send after kick: err = %v, want the CloseError", err)
		}
	})
}

// TestFakeReconnectMoves: the server's Reconnect makes the client log in again after the delay
// (a draining node: here the same fake), recovering from the last message, and leave the old
// connection.
func TestFakeReconnectMoves(t *testing.T) {
	forEachTransport(t, func(t *testing.T, transport string) {
		var logins atomic.Int32
		second := make(chan *clientpb.Login, 1)
		link := startFakeLink(t, func(c fakeConn) {
			l, err := acceptLogin(c, "cl-1", time.Minute)
			if err != nil {
				return
			}
			if logins.Add(1) == 1 {
				_ = c.send(pushFrame(&clientpb.Message{Id: "01KB0000000000000000000001", RoomSeq: 7, Body: []byte("one")}))
				_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_Reconnect{Reconnect: &clientpb.Reconnect{DelayMs: 200, Reason: "draining"}}})
			} else {
				second <- l
				_ = c.send(historyEnd(true, 0))
			}
			answerLoop(c)
		})
		rec := newRecorder()
		c, err := dialFake(t, transport, rec.config(sdk.Config{}), link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := waitFor[*sdk.ReconnectingEvent](t, rec, 3*time.Second)
		if r.Delay != 200*time.Millisecond || !errors.Is(r.Err, sdk.ErrMoved) {
			t.Errorf("reconnecting event %+v, want 200ms and ErrMoved", r)
		}
		select {
		case l := <-second:
			if l.GetRecoverSince() != "01KB0000000000000000000001" || l.GetRecoverSinceRoomSeq() != 7 {
				t.Errorf("the move's login recovers since %q (room_seq %d), want the last message", l.GetRecoverSince(), l.GetRecoverSinceRoomSeq())
			}
		case <-time.After(3 * time.Second):
			t.Fatal("no second login after the Reconnect")
		}
		if got := waitFor[*sdk.RecoveredEvent](t, rec, 3*time.Second); !got.Recovered {
			t.Errorf("recovered event %+v", got)
		}
		if _, err := c.Send(context.Background(), sdk.Outgoing{Body: []byte("still up")}); err != nil {
			t.Errorf("Send after the move: %v", err)
		}
		if got := fmt.Sprint(rec.order()); got != "[connected one reconnecting connected recovered]" {
			t.Errorf("callbacks ran as %s", got)
		}
	})
}

// TestFakeMoveKeepsSendInFlight: a Send written on a connection that a move then leaves gets
// the old node's answer (the draining node still serves it), not ErrMoved; and Sends after
// the move go to the new connection.
func TestFakeMoveKeepsSendInFlight(t *testing.T) {
	forEachTransport(t, func(t *testing.T, transport string) {
		var logins atomic.Int32
		moved := make(chan struct{})
		link := startFakeLink(t, func(c fakeConn) {
			if logins.Add(1) == 1 {
				if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
					return
				}
				// Ask for the move with the first Send, and answer it only once the
				// client has logged in elsewhere.
				f, err := c.recv()
				if err != nil || f.GetSend() == nil {
					return
				}
				_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_Reconnect{Reconnect: &clientpb.Reconnect{Reason: "draining"}}})
				select {
				case <-moved:
				case <-time.After(5 * time.Second):
					return
				}
				_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{
					Seq: f.GetSend().GetSeq(), MessageId: "01KB0000000000000000000001",
				}}})
				answerLoop(c)
				return
			}
			if _, err := acceptLogin(c, "cl-2", time.Minute); err != nil {
				return
			}
			close(moved)
			for {
				f, err := c.recv()
				if err != nil {
					return
				}
				if s := f.GetSend(); s != nil {
					_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{
						Seq: s.GetSeq(), MessageId: "01KB0000000000000000000002",
					}}})
				}
			}
		})
		rec := newRecorder()
		c, err := dialFake(t, transport, rec.config(sdk.Config{}), link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ack, err := c.Send(context.Background(), sdk.Outgoing{Body: []byte("in flight")})
		if err != nil || ack.GetMessageId() != "01KB0000000000000000000001" {
			t.Fatalf("the Send in flight during the move: %v, %v; want the old node's answer", ack, err)
		}
		// Once the app has seen the new connection, its Sends go there.
		testkit.CheckFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if len(all[*sdk.ConnectedEvent](rec)) < 2 {
				return errors.New("no ConnectedEvent for the move's login")
			}
			return nil
		})
		ack, err = c.Send(context.Background(), sdk.Outgoing{Body: []byte("after")})
		if err != nil || ack.GetMessageId() != "01KB0000000000000000000002" {
			t.Fatalf("the Send after the move: %v, %v; want the new node's answer", ack, err)
		}
	})
}

// TestFakeMoveRetried: the move's first login is refused (the draining node itself, handed out
// again by a dispatcher that does not know yet); the client tries again after its backoff, gets
// in, and leaves the old connection instead of staying on the draining node until it closes.
func TestFakeMoveRetried(t *testing.T) {
	forEachTransport(t, func(t *testing.T, transport string) {
		var logins atomic.Int32
		moved := make(chan struct{})
		firstGone := make(chan struct{})
		link := startFakeLink(t, func(c fakeConn) {
			switch logins.Add(1) {
			case 1:
				if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
					return
				}
				_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_Reconnect{Reconnect: &clientpb.Reconnect{DelayMs: 10, Reason: "draining"}}})
				answerLoop(c)
				close(firstGone)
			case 2:
				_, _ = c.recv()
				c.kick(uint32(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN), "node is draining")
			default:
				if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
					return
				}
				close(moved)
				answerLoop(c)
			}
		})
		c, err := dialFake(t, transport, sdk.Config{ReconnectMinDelay: 20 * time.Millisecond, ReconnectMaxDelay: 50 * time.Millisecond}, link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for what, ch := range map[string]chan struct{}{"a login after the refused one": moved, "the old connection closed": firstGone} {
			select {
			case <-ch:
			case <-time.After(3 * time.Second):
				t.Fatalf("no %s", what)
			}
		}
	})
}

func TestFakeSlowConsumer(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		link := startFakeLink(t, func(c fakeConn) {
			if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
				return
			}
			for i := range 20 {
				_ = c.send(pushFrame(&clientpb.Message{Id: string(rune('a' + i)), Body: []byte("flood")}))
			}
			answerLoop(c)
		})
		release := make(chan struct{})
		c, err := dialFake(t, transport, sdk.Config{NoReconnect: true, MessageBuffer: 2, OnMessage: func(*clientpb.Message) { <-release }}, link)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("client did not end with a full buffer")
		}
		close(release)
		c.Close()
		if !errors.Is(c.Err(), sdk.ErrSlowConsumer) {
			t.Errorf("Err = %v, want ErrSlowConsumer", c.Err())
		}
	})
}

func TestFakeSendContextAndSize(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, transport string) {
		link := startFakeLink(t, func(c fakeConn) {
			if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
				return
			}
			for { // never answer a Send
				if _, err := c.recv(); err != nil {
					return
				}
			}
		})
		c, err := dialFake(t, transport, sdk.Config{}, link)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.Send(ctx, sdk.Outgoing{Body: []byte("x")}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Send err = %v, want DeadlineExceeded", err)
		}
		if _, err := c.Send(context.Background(), sdk.Outgoing{Body: make([]byte, sdk.MaxFrameSize)}); !errors.Is(err, sdk.ErrFrameTooLarge) {
			t.Errorf("huge Send err = %v, want ErrFrameTooLarge", err)
		}
		if c.Err() != nil {
			t.Errorf("Err = %v after refused Sends, want nil", c.Err())
		}
	})
}

// Not parallel: it counts the process's goroutines.
func TestFakeCloseIsIdempotent(t *testing.T) {
	forEachTransport(t, func(t *testing.T, transport string) {
		link := startFakeLink(t, serveBasic("cl-1", time.Minute))
		var closes atomic.Int32
		c, err := dialFake(t, transport, sdk.Config{OnEvent: func(ev sdk.Event) {
			if _, ok := ev.(*sdk.ClosedEvent); ok {
				closes.Add(1)
			}
		}}, link)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { _ = c.Close() })
		}
		wg.Wait()
		_ = c.Close()
		if !errors.Is(c.Err(), sdk.ErrClosed) {
			t.Errorf("Err = %v, want ErrClosed", c.Err())
		}
		if n := closes.Load(); n != 1 {
			t.Errorf("%d closed events, want 1", n)
		}
		if _, err := c.Send(context.Background(), sdk.Outgoing{Body: []byte("x")}); !errors.Is(err, sdk.ErrClosed) {
			t.Errorf("Send after Close: %v, want ErrClosed", err)
		}
		goleak.VerifyNone(t, goleak.IgnoreCurrent())
	})
}

func TestDialConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  sdk.Config
		want error
	}{
		{"no token", sdk.Config{Dispatcher: "http://127.0.0.1:1"}, sdk.ErrBadToken},
		{"malformed token", sdk.Config{Token: "abc", Dispatcher: "http://127.0.0.1:1"}, sdk.ErrBadToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := sdk.Dial(ctx, tc.cfg); !errors.Is(err, tc.want) {
				t.Errorf("Dial err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := sdk.Dial(ctx, sdk.Config{Token: "x", Transport: "quic", Endpoints: []sdk.Endpoint{{}}}); err == nil {
		t.Error("Dial accepted an unknown transport")
	}
	if _, err := sdk.Dial(ctx, sdk.Config{Token: "x"}); err == nil {
		t.Error("Dial accepted a Config without Dispatcher or Endpoints")
	}
}
