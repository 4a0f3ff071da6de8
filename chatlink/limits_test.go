package chatlink_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// testClock is a node's clock (Config.Now) that moves only when told, so a bucket does not
// refill while a loaded machine runs the test slowly.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func limitedCount(t *testing.T, c *devcluster.Cluster, node, limit string) int {
	t.Helper()
	return metricValue(t, c, `roomcast_chatlink_limited_total{limit="`+limit+`",node="`+node+`"}`)
}

// TestSendRates: sends under a rate pass, the first over it gets Error 120 with a retry hint,
// and a send after the hinted wait passes again; per connection and per room.
func TestSendRates(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Now = clock.now
		cfg.ChatLink.Limits.SendsPerConn = ratelimit.Limit{Rate: 5, Burst: 3} // 200ms a token
		cfg.ChatLink.Limits.SendsPerRoom = ratelimit.Limit{Rate: 2, Burst: 5} // 500ms a token
	})
	node := c.Nodes[0]
	a := testkit.DialTCP(t, node.TCPAddr())
	a.Login(testcluster.Token(t, "alice", "sr"))
	seq := uint64(0)
	send := func(cl *testkit.Client) *clientpb.Frame {
		seq++
		cl.Send(sendFrame(seq, "hi"))
		for {
			if f := cl.Next(); f.GetSendAck() != nil || f.GetError() != nil {
				return f
			}
		}
	}
	for i := range 3 {
		if f := send(a); f.GetSendAck() == nil {
			t.Fatalf("send %d of a burst of 3: %v", i+1, f)
		}
	}
	f := send(a)
	e := f.GetError()
	if e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) || e.Seq != seq {
		t.Fatalf("fourth send: want Error 120 for seq %d, got %v", seq, f)
	}
	if e.RetryAfterMs == 0 || e.RetryAfterMs > 200 {
		t.Fatalf("retry_after_ms %d, want 1..200 at 5/s", e.RetryAfterMs)
	}
	clock.advance(time.Duration(e.RetryAfterMs) * time.Millisecond)
	if f := send(a); f.GetSendAck() == nil {
		t.Fatalf("send after the retry hint: %v", f)
	}
	if n := limitedCount(t, c, node.Name(), "send_conn"); n != 1 {
		t.Fatalf("limited_total{send_conn} = %d, want 1", n)
	}
	// The room has had 4 of its burst of 5: a second member gets one more, then the room's limit.
	b := testkit.DialTCP(t, node.TCPAddr())
	b.Login(testcluster.Token(t, "bob", "sr"))
	if f := send(b); f.GetSendAck() == nil {
		t.Fatalf("bob's first send: %v", f)
	}
	f = send(b)
	if e := f.GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) || e.RetryAfterMs == 0 || e.RetryAfterMs > 500 {
		t.Fatalf("bob's second send: want Error 120 with a retry within 500ms, got %v", f)
	}
	if n := limitedCount(t, c, node.Name(), "send_room"); n != 1 {
		t.Fatalf("limited_total{send_room} = %d, want 1", n)
	}
}

// TestJoinRate: logins into a room over its rate get Error 121 with a retry hint, then Kick 4013.
func TestJoinRate(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Now = clock.now
		cfg.ChatLink.Limits.JoinsPerRoom = ratelimit.Limit{Rate: 1, Burst: 2}
	})
	node := c.Nodes[0]
	for i, uid := range []string{"u1", "u2"} {
		cl := testkit.DialWS(t, node.WSURL())
		if f := cl.LoginAs(testcluster.Token(t, uid, "jr"), "web"); f.GetLoginAck() == nil {
			t.Fatalf("login %d of a burst of 2: %v", i+1, f)
		}
	}
	other := testkit.DialWS(t, node.WSURL())
	other.Login(testcluster.Token(t, "u9", "another-room")) // another room is not held
	cl := testkit.DialWS(t, node.WSURL())
	f := cl.LoginAs(testcluster.Token(t, "u3", "jr"), "web")
	e := f.GetError()
	if e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_LOGIN_RATE_LIMITED) || e.RetryAfterMs == 0 || e.RetryAfterMs > 1000 {
		t.Fatalf("third login: want Error 121 with a retry within 1s, got %v", f)
	}
	if k := cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_LOGIN_RATE_LIMITED); k.RetryAfterMs != e.RetryAfterMs {
		t.Fatalf("Kick 4013: retry_after_ms = %d, want the Error's %d", k.RetryAfterMs, e.RetryAfterMs)
	}
	if n := limitedCount(t, c, node.Name(), "join_room"); n != 1 {
		t.Fatalf("limited_total{join_room} = %d, want 1", n)
	}
}

// upgradeStatus sends a WebSocket upgrade to the node as a trusted proxy forwarding for client
// and returns the HTTP status.
func upgradeStatus(t *testing.T, wsURL, client string) int {
	t.Helper()
	status, nc := upgrade(t, wsURL, client)
	nc.Close()
	return status
}

// upgrade is upgradeStatus keeping the connection open.
func upgrade(t *testing.T, wsURL, client string) (int, net.Conn) {
	t.Helper()
	resp, nc := upgradeResponse(t, wsURL, client)
	return resp.StatusCode, nc
}

// upgradeResponse is upgrade returning the whole answer.
func upgradeResponse(t *testing.T, wsURL, client string) (*http.Response, net.Conn) {
	t.Helper()
	u, _ := url.Parse(wsURL)
	nc, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_, _ = nc.Write([]byte("GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nX-Forwarded-For: " + client + "\r\n\r\n"))
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, nc
}

// TestAddressLists: behind a trusted proxy, the forwarded address is what the node's list
// and per-address connection limit judge; the list file is re-read when it changes.
func TestAddressLists(t *testing.T) {
	t.Parallel()
	list := filepath.Join(t.TempDir(), "ips")
	if err := os.WriteFile(list, []byte("# test\ndeny 198.51.100.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.TrustedProxies = []string{"127.0.0.1"}
		cfg.ChatLink.IPListFile = list
		cfg.ChatLink.Limits.ConnectionsPerIP = 1
	})
	node := c.Nodes[0]
	if s := upgradeStatus(t, node.WSURL(), "198.51.100.7"); s != http.StatusForbidden {
		t.Fatalf("denied CIDR: status %d, want 403", s)
	}
	if s := upgradeStatus(t, node.WSURL(), "203.0.113.9"); s != http.StatusSwitchingProtocols {
		t.Fatalf("allowed address: status %d, want 101", s)
	}
	if n := limitedCount(t, c, node.Name(), "denied_ip"); n != 1 {
		t.Fatalf("limited_total{denied_ip} = %d, want 1", n)
	}
	// A handshake that is not HTTP is answered 400 and counted.
	u, _ := url.Parse(node.WSURL())
	garbage, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = garbage.Write([]byte("\x16\x03\x01 not http\r\n\r\n"))
	_, _ = io.ReadAll(garbage)
	garbage.Close()
	if n := metricValue(t, c, `roomcast_chatlink_handshakes_failed_total{handshake="websocket",node="`+node.Name()+`",reason="bad"}`); n != 1 {
		t.Fatalf("handshakes_failed_total{websocket,bad} = %d, want 1", n)
	}
	// A client on the peer's own address (loopback) is not held by the per-address limit.
	testkit.DialWS(t, node.WSURL()).Login(testcluster.Token(t, "local1", "al"))
	testkit.DialWS(t, node.WSURL()).Login(testcluster.Token(t, "local2", "al"))

	// An allow list refuses every address not on it; the change applies within about a second.
	if err := os.WriteFile(list, []byte("allow 203.0.113.0/24\ndeny 203.0.113.9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if s := upgradeStatus(t, node.WSURL(), "198.18.0.1"); s != http.StatusForbidden {
			return errStatus(s)
		}
		return nil
	})
	if s := upgradeStatus(t, node.WSURL(), "203.0.113.9"); s != http.StatusForbidden {
		t.Fatalf("denied single address inside an allowed CIDR: status %d, want 403", s)
	}
	if s := upgradeStatus(t, node.WSURL(), "203.0.113.10"); s != http.StatusSwitchingProtocols {
		t.Fatalf("allowed CIDR: status %d, want 101", s)
	}
	// One connection per address: a second one from it is refused with 429 while the first is open.
	// (The polling above may itself have met the limit, when a poll came before the node had
	// let go of the one before it: count from here.)
	before := limitedCount(t, c, node.Name(), "connections_ip")
	if s, _ := upgrade(t, node.WSURL(), "203.0.113.11"); s != http.StatusSwitchingProtocols {
		t.Fatalf("first connection: status %d, want 101", s)
	}
	resp, nc := upgradeResponse(t, node.WSURL(), "203.0.113.11")
	nc.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Roomcast-Close-Code") != "4015" || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("second connection of one address: %s %v, want 429 with Roomcast-Close-Code 4015 and Retry-After 2", resp.Status, resp.Header)
	}
	if n := limitedCount(t, c, node.Name(), "connections_ip") - before; n != 1 {
		t.Fatalf("limited_total{connections_ip} went up by %d, want 1", n)
	}
}

type errStatus int

func (e errStatus) Error() string { return "status " + http.StatusText(int(e)) }

// putAppLimits sets the dev app's limits through the server API.
func putAppLimits(t *testing.T, c *devcluster.Cluster, body string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", c.URL()+"/v1/limits", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT /v1/limits %s: HTTP %d %s", body, resp.StatusCode, b)
	}
}

// TestAppLimitsLive: an app's own limits and address list, set through the server API, apply
// to the ChatLink's connections within about a second, and removing them lifts them.
func TestAppLimitsLive(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]
	a := testkit.DialTCP(t, node.TCPAddr())
	a.Login(testcluster.Token(t, "alice", "live"))
	seq := uint64(0)
	send := func() *clientpb.Frame {
		seq++
		a.Send(sendFrame(seq, "hi"))
		for {
			if f := a.Next(); f.GetSendAck() != nil || f.GetError() != nil {
				return f
			}
		}
	}
	for range 5 { // no limit by default in a test cluster
		if f := send(); f.GetSendAck() == nil {
			t.Fatalf("send without a limit: %v", f)
		}
	}
	putAppLimits(t, c, `{"sends_per_conn": "1/m:1"}`)
	start := time.Now()
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if f := send(); f.GetError().GetCode() != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) {
			return fmt.Errorf("send after the change: %v", f)
		}
		return nil
	})
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("the app's limit took %v to apply", d)
	}
	// The app's deny list refuses a login from the client's address with 4014.
	putAppLimits(t, c, `{"deny": ["127.0.0.0/8", "::1"]}`)
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		cl := testkit.DialTCP(t, node.TCPAddr())
		defer cl.Close()
		if f := cl.LoginAs(testcluster.Token(t, "bob", "live"), "web"); f.GetKick().GetCode() != uint32(clientpb.CloseCode_CLOSE_CODE_ADDRESS_DENIED) {
			return fmt.Errorf("login from a denied address: %v", f)
		}
		return nil
	})
	if n := limitedCount(t, c, node.Name(), "denied_ip_app"); n < 1 {
		t.Fatalf("limited_total{denied_ip_app} = %d, want at least 1", n)
	}
	// Limits removed: the node's (none here) apply again.
	putAppLimits(t, c, `{}`)
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		cl := testkit.DialTCP(t, node.TCPAddr())
		defer cl.Close()
		if f := cl.LoginAs(testcluster.Token(t, "carol", "live"), "web"); f.GetLoginAck() == nil {
			return fmt.Errorf("login after the lists were removed: %v", f)
		}
		return nil
	})
}

// TestLoginRates: logins from one address (behind a trusted proxy) and into one app trip at
// their rates with Error 121 and Kick 4013, and other addresses and apps are not held.
func TestLoginRates(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Now = clock.now
		cfg.ChatLink.TrustedProxies = []string{"127.0.0.1", "::1"}
		cfg.ChatLink.Limits.LoginsPerIP = ratelimit.Limit{Rate: 1, Burst: 2}
		cfg.ChatLink.Limits.LoginsPerApp = ratelimit.Limit{Rate: 1, Burst: 4}
	})
	node := c.Nodes[0]
	login := func(from, uid string) *clientpb.Frame {
		return testkit.DialWSFor(t, node.WSURL(), from).LoginAs(testcluster.Token(t, uid, "lr"), "web")
	}
	refused := func(f *clientpb.Frame) bool {
		e := f.GetError()
		return e != nil && e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_LOGIN_RATE_LIMITED) && e.RetryAfterMs > 0 && e.RetryAfterMs <= 1000
	}
	for i, uid := range []string{"a1", "a2"} {
		if f := login("203.0.113.1", uid); f.GetLoginAck() == nil {
			t.Fatalf("login %d from one address, of a burst of 2: %v", i+1, f)
		}
	}
	if f := login("203.0.113.1", "a3"); !refused(f) {
		t.Fatalf("third login from one address: want Error 121 with a retry within 1s, got %v", f)
	}
	if n := limitedCount(t, c, node.Name(), "login_ip"); n != 1 {
		t.Fatalf("limited_total{login_ip} = %d, want 1", n)
	}
	// Another address has its own bucket; the app's burst of 4 is now spent (the refused login
	// spent nothing of it).
	for i, uid := range []string{"b1", "b2"} {
		if f := login("203.0.113.2", uid); f.GetLoginAck() == nil {
			t.Fatalf("login %d from another address: %v", i+1, f)
		}
	}
	if f := login("203.0.113.3", "c1"); !refused(f) {
		t.Fatalf("fifth login into the app: want Error 121, got %v", f)
	}
	if n := limitedCount(t, c, node.Name(), "login_app"); n != 1 {
		t.Fatalf("limited_total{login_app} = %d, want 1", n)
	}
}

// TestIPListSIGHUPAndBadFile: SIGHUP reads the list file again even when its time and size
// did not change (a copy put back in place), and a file that does not parse keeps the lists
// in force and is counted in roomcast_chatlink_ip_list_reloads_total{result="error"}.
func TestIPListSIGHUPAndBadFile(t *testing.T) {
	t.Parallel()
	list := filepath.Join(t.TempDir(), "ips")
	if err := os.WriteFile(list, []byte("deny 198.51.100.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(list)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.TrustedProxies = []string{"127.0.0.1"}
		cfg.ChatLink.IPListFile = list
	})
	node := c.Nodes[0]
	reloads := func(result string) int {
		return metricValue(t, c, `roomcast_chatlink_ip_list_reloads_total{node="`+node.Name()+`",result="`+result+`"}`)
	}
	wantStatus := func(client string, want int) error {
		if s := upgradeStatus(t, node.WSURL(), client); s != want {
			return fmt.Errorf("%s: status %d, want %d", client, s, want)
		}
		return nil
	}
	if err := wantStatus("198.51.100.7", http.StatusForbidden); err != nil {
		t.Fatal(err)
	}
	// Another list of the same size and modification time: the poll cannot tell, SIGHUP reads it.
	if err := os.WriteFile(list, []byte("deny 198.51.101.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(list, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if err := wantStatus("198.51.101.7", http.StatusForbidden); err != nil {
			return err
		}
		return wantStatus("198.51.100.7", http.StatusSwitchingProtocols)
	})
	if n := reloads("ok"); n != 1 {
		t.Fatalf("ip_list_reloads_total{ok} = %d after the SIGHUP, want 1", n)
	}
	// A file that does not parse: counted once, and the list read before stays in force.
	if err := os.WriteFile(list, []byte("deny 198.51.101.0/24\nnonsense here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if n := reloads("error"); n != 1 {
			return fmt.Errorf("ip_list_reloads_total{error} = %d, want 1", n)
		}
		return nil
	})
	if err := wantStatus("198.51.101.7", http.StatusForbidden); err != nil {
		t.Fatalf("after a bad file: %v", err)
	}
}
