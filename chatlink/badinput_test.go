package chatlink_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// closeCount reads how many connections node closed with code from /metrics.
func closeCount(t *testing.T, c *devcluster.Cluster, node string, code string) int {
	t.Helper()
	return metricValue(t, c, `roomcast_chatlink_closes_total{code="`+code+`",node="`+node+`"}`)
}

// metricValue reads one series from /metrics; a series not there yet reads 0.
func metricValue(t *testing.T, c *devcluster.Cluster, series string) int {
	t.Helper()
	return testkit.MetricValue(t, c.URL()+"/metrics", series)
}

func expiredToken(t *testing.T) string {
	t.Helper()
	past := time.Now().Add(-time.Hour)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, auth.Claims{
		App: devcluster.App, UID: "late", Room: "r1",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(past), IssuedAt: jwt.NewNumericDate(past.Add(-time.Hour))},
	}).SignedString([]byte(devcluster.Secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func loginFrame(tok string) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: tok}}}
}

// TestBadInput sends each kind of bad input over each transport and checks the documented close
// code, that it is counted in the metrics, and that the node serves others normally afterwards.
func TestBadInput(t *testing.T) {
	t.Parallel()
	t.Run("poller", func(t *testing.T) { t.Parallel(); testBadInput(t, false) })
	t.Run("reader goroutines", func(t *testing.T) { t.Parallel(); testBadInput(t, true) })
}

func testBadInput(t *testing.T, readerGoroutines bool) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.LoginTimeout = 300 * time.Millisecond
		cfg.ChatLink.ReaderGoroutines = readerGoroutines
	})
	node := c.Nodes[0]
	wrongSecret, err := auth.Mint([]byte("not-the-secret"), devcluster.App, "mallory", "r1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	// A healthy member of the room watches throughout: bad clients must not disturb it.
	watcher := testkit.DialWS(t, node.WSURL())
	watcher.Login(testcluster.Token(t, "watcher", "r1"))

	cases := []struct {
		name string
		code clientpb.CloseCode
		act  func(c *testkit.Client)
	}{
		{"bad signature", clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, func(cl *testkit.Client) { cl.Send(loginFrame(wrongSecret)) }},
		{"token not a JWT", clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, func(cl *testkit.Client) { cl.Send(loginFrame("not.a.token")) }},
		{"expired token", clientpb.CloseCode_CLOSE_CODE_TOKEN_EXPIRED, func(cl *testkit.Client) { cl.Send(loginFrame(expiredToken(t))) }},
		{"garbage frame", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, func(cl *testkit.Client) { _ = cl.SendPayload([]byte{0xff, 0xff, 0xff, 0x01, 0x02}) }},
		{"empty frame kind", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, func(cl *testkit.Client) { cl.Send(&clientpb.Frame{}) }},
		{"send before login", clientpb.CloseCode_CLOSE_CODE_NOT_LOGGED_IN, func(cl *testkit.Client) { cl.Send(sendFrame(1, "hi")) }},
		{"heartbeat before login", clientpb.CloseCode_CLOSE_CODE_NOT_LOGGED_IN, func(cl *testkit.Client) {
			cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{}}})
		}},
		{"server-only frame", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, func(cl *testkit.Client) {
			cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{}}})
		}},
		{"second login", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, func(cl *testkit.Client) {
			cl.Login(testcluster.Token(t, "twice", "r1"))
			cl.Send(loginFrame(testcluster.Token(t, "twice", "r1")))
		}},
		{"no login in time", clientpb.CloseCode_CLOSE_CODE_LOGIN_TIMEOUT, func(*testkit.Client) {}},
	}
	for _, tc := range cases {
		for _, transport := range []string{"ws", "tcp"} {
			t.Run(tc.name+"/"+transport, func(t *testing.T) {
				before := closeCount(t, c, node.Name(), tc.code.String())
				var cl *testkit.Client
				if transport == "ws" {
					cl = testkit.DialWS(t, node.WSURL())
				} else {
					cl = testkit.DialTCP(t, node.TCPAddr())
				}
				tc.act(cl)
				cl.ExpectKick(tc.code)
				if after := closeCount(t, c, node.Name(), tc.code.String()); after != before+1 {
					t.Fatalf("closes_total{code=%s} went from %d to %d, want +1", tc.code, before, after)
				}
			})
		}
	}

	t.Run("websocket text message", func(t *testing.T) {
		tc := testkit.DialWS(t, node.WSURL())
		if err := tc.SendText("hello?"); err != nil {
			t.Fatal(err)
		}
		tc.ExpectKick(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME)
	})

	t.Run("oversize frame/ws", func(t *testing.T) {
		before := closeCount(t, c, node.Name(), "CLOSE_CODE_FRAME_TOO_LARGE")
		defer func() {
			testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
				if after := closeCount(t, c, node.Name(), "CLOSE_CODE_FRAME_TOO_LARGE"); after != before+1 {
					return fmt.Errorf("FRAME_TOO_LARGE closes went from %d to %d", before, after)
				}
				return nil
			})
		}()
		cl := testkit.DialWS(t, node.WSURL())
		cl.Login(testcluster.Token(t, "big", "r1"))
		_ = cl.SendPayload(bytes.Repeat([]byte{1}, 65537))
		cl.ExpectClose(1009) // RFC 6455 "message too big", sent by the WebSocket layer
	})

	t.Run("oversize frame/tcp", func(t *testing.T) {
		before := closeCount(t, c, node.Name(), "CLOSE_CODE_FRAME_TOO_LARGE")
		cl := testkit.DialTCP(t, node.TCPAddr())
		// Only the length prefix: the node must refuse it without waiting for (or buffering)
		// the 1 GiB it announces.
		if err := cl.Write([]byte{0x40, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE)
		if after := closeCount(t, c, node.Name(), "CLOSE_CODE_FRAME_TOO_LARGE"); after != before+1 {
			t.Fatalf("FRAME_TOO_LARGE closes went from %d to %d", before, after)
		}
	})

	t.Run("partial frame then silence", func(t *testing.T) {
		cl := testkit.DialTCP(t, node.TCPAddr())
		if err := cl.Write([]byte{0, 0, 0, 10, 1, 2}); err != nil { // 2 of 10 announced bytes
			t.Fatal(err)
		}
		cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_LOGIN_TIMEOUT)
	})

	t.Run("pings do not extend the login deadline", func(t *testing.T) {
		// The deadline runs from the connect: before, every frame restarted it, so a client
		// that pinged every 2 s stayed unauthenticated forever.
		cl := testkit.DialWS(t, node.WSURL())
		start := time.Now()
		stop := make(chan struct{})
		pinged := make(chan struct{})
		go func() {
			defer close(pinged)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if cl.Ping() != nil {
						return
					}
				}
			}
		}()
		defer func() { close(stop); <-pinged }()
		cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_LOGIN_TIMEOUT)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("closed after %v with a 300ms login deadline", took)
		}
	})

	t.Run("bad sends get errors, connection stays", func(t *testing.T) {
		cl := testkit.DialWS(t, node.WSURL())
		cl.Login(testcluster.Token(t, "sender", "r1"))
		for i, s := range []*clientpb.Send{
			{Seq: 1, Body: nil},
			{Seq: 2, Body: bytes.Repeat([]byte("x"), 16<<10+1)},
			{Seq: 3, Body: []byte("x"), Lane: 9},
			{Seq: 4, Body: []byte("x"), TagExpr: `"a" in`},
		} {
			cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: s}})
			e := cl.Next().GetError()
			want := []clientpb.ErrorCode{clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE,
				clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR}[i]
			if e == nil || e.Seq != s.Seq || e.Code != uint32(want) {
				t.Fatalf("send %d: want Error %v, got %v", s.Seq, want, e)
			}
		}
		cl.ExpectSilence(0)
		watcher.ExpectSilence(100 * time.Millisecond) // nothing bad reached the room
	})

	// After all that the node still serves: a fresh member's message reaches the watcher.
	ok := testkit.DialTCP(t, node.TCPAddr())
	ok.Login(testcluster.Token(t, "fine", "r1"))
	ok.Send(sendFrame(1, "still here"))
	if ok.Next().GetSendAck() == nil {
		t.Fatal("no SendAck after the bad input")
	}
	if msgs := watcher.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "still here" {
		t.Fatalf("watcher got %v", msgs)
	}
	if got := node.Connections(); got != 2 {
		t.Fatalf("node holds %d connections, want 2 (watcher and the last client)", got)
	}
}

// TestHeartbeat moves the node's clock: beats keep a connection alive past three intervals,
// and silence closes it once three of its current intervals have passed, not before.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.ChatLink.HeartbeatInterval = 100 * time.Millisecond }, withClock(clock))
	node := c.Nodes[0]
	cl := testkit.DialWS(t, node.WSURL())
	ack := cl.Login(testcluster.Token(t, "beat", "r1"))
	if ack.HeartbeatIntervalMs != 100 {
		t.Fatalf("announced interval %dms, want 100", ack.HeartbeatIntervalMs)
	}
	const timeouts = "CLOSE_CODE_HEARTBEAT_TIMEOUT"
	// Beating keeps the connection alive well past three intervals.
	var interval time.Duration
	for i := 0; i < 6; i++ {
		clock.Add(100 * time.Millisecond)
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: int64(i)}}})
		a := cl.Next().GetHeartbeatAck()
		if a == nil || a.ClientTimeMs != int64(i) || a.ServerTimeMs != clock.Now().UnixMilli() {
			t.Fatalf("heartbeat %d answered with %v", i, a)
		}
		interval = time.Duration(a.HeartbeatIntervalMs) * time.Millisecond
		node.Sweep()
	}
	if n := closeCount(t, c, node.Name(), timeouts); n != 0 {
		t.Fatalf("%d connections closed for silence while beating", n)
	}
	// Silence is not, once three intervals (the last one granted) have passed.
	clock.Add(3 * interval)
	node.Sweep()
	if n := closeCount(t, c, node.Name(), timeouts); n != 0 {
		t.Fatalf("closed after exactly three intervals of %v", interval)
	}
	clock.Add(time.Millisecond)
	node.Sweep()
	cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_HEARTBEAT_TIMEOUT)
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		if n := c.Nodes[0].Connections(); n != 0 {
			return fmt.Errorf("%d connections left", n)
		}
		return nil
	})
}

// TestUpgradeRequests sends raw upgrade requests: another path is 404, a malformed request
// or another method 400, and a browser-like request with a large cookie upgrades.
func TestUpgradeRequests(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	addr := strings.TrimSuffix(strings.TrimPrefix(c.Nodes[0].WSURL(), "ws://"), "/v1/ws")
	const upgrade = "Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	for _, tc := range []struct{ name, req, status string }{
		{"browser-like", "GET /v1/ws HTTP/1.1\r\n" + upgrade + "User-Agent: Mozilla/5.0\r\nCookie: " +
			strings.Repeat("k=v; ", 400) + "\r\n\r\n", "101"},
		{"other path", "GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n", "404"},
		{"POST", "POST /v1/ws HTTP/1.1\r\n" + upgrade + "\r\n", "400"},
		{"no key", "GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n", "400"},
		{"garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "400"},
	} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(nc, tc.req); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(nc).ReadString('\n')
		_ = nc.Close()
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 "+tc.status+" ") {
			t.Errorf("%s: answer %q (%v), want %s", tc.name, line, err, tc.status)
		}
	}
}

// TestTokenMaxLifetime: a token that would stay valid longer than its app's maximum lifetime
// (Config.MaxTokenLifetime, here 2h) is refused at login with 4001 and a reason that says so;
// one within it logs in.
func TestTokenMaxLifetime(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.MaxTokenLifetime = auth.Lifetimes{devcluster.App: 2 * time.Hour}
	})
	ok := testkit.DialWS(t, c.Nodes[0].WSURL())
	ok.Login(testcluster.Token(t, "brief", "r1"))
	long, err := c.Mint("lasting", "r1", nil, 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Send(loginFrame(long))
	f := cl.Next()
	if k := f.GetKick(); k.GetCode() != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) || !strings.Contains(k.GetReason(), "maximum token lifetime") {
		t.Fatalf("want Kick BAD_TOKEN naming the maximum token lifetime, got %v", f)
	}
	cl.ExpectClose(uint16(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN))
}
