package callback_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/callback"
	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

var secret = []byte("an-app-callback-secret-0123")

// rulesBackend is an app's backend with rules, served over real HTTP: it verifies every
// request, denies uid "mallory", gives "alice" the tag vip and clears "carol"'s, denies
// messages saying "spam", rewrites "darn" to "****" of type censored and sends messages saying
// "lower" one lane lower (critical on normal, normal on bulk).
type rulesBackend struct {
	logins, sends, bad atomic.Int64
	bobLogin           atomic.Value // the login request of uid bob
}

func (b *rulesBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if callback.Verify(secret, r.Header.Get(callback.HeaderTimestamp), r.Header.Get(callback.HeaderSignature), body, time.Now()) != nil {
		b.bad.Add(1)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/login":
		b.logins.Add(1)
		var req callback.LoginRequest
		_ = json.Unmarshal(body, &req)
		if req.UID == "bob" {
			b.bobLogin.Store(req)
		}
		switch req.UID {
		case "mallory":
			_, _ = io.WriteString(w, `{"allow":false,"reason":"mallory is not welcome"}`)
		case "alice":
			_, _ = io.WriteString(w, `{"allow":true,"tags":["vip"]}`)
		case "carol":
			_, _ = io.WriteString(w, `{"allow":true,"tags":[]}`)
		default:
			_, _ = io.WriteString(w, `{"allow":true}`)
		}
	case "/send":
		b.sends.Add(1)
		var req callback.SendRequest
		_ = json.Unmarshal(body, &req)
		switch {
		case strings.Contains(string(req.Body), "spam"):
			_, _ = io.WriteString(w, `{"allow":false,"reason":"no spam here"}`)
		case strings.Contains(string(req.Body), "darn"):
			_ = json.NewEncoder(w).Encode(map[string]any{"allow": true, "body": []byte("****"), "type": "censored"})
		case strings.Contains(string(req.Body), "lower"):
			_ = json.NewEncoder(w).Encode(map[string]any{"allow": true, "lane": req.Lane + 1})
		default:
			_, _ = io.WriteString(w, `{"allow":true}`)
		}
	}
}

// Apps of the cluster besides devcluster.App, each with a backend that is not there.
const (
	appLoginClosed = "loginclosed" // login hook dead, fail-closed
	appOpen        = "open"        // both hooks dead, fail-open
	appSendClosed  = "sendclosed"  // send hook dead, fail-closed
)

// withApps gives every ChatLink the keys of the test's apps too.
func withApps(apps ...string) testcluster.Option {
	return func(c *devcluster.Config) {
		keys := auth.Keyring{devcluster.App: []byte(devcluster.Secret)}
		for _, a := range apps {
			keys[a] = []byte(devcluster.Secret)
		}
		c.ChatLink.Keys = keys
	}
}

func withCallbacks(apps map[string]callback.AppConfig) testcluster.Option {
	return func(c *devcluster.Config) { c.Callbacks.Apps = apps }
}

func token(t testing.TB, app, uid, room string, tags ...string) string {
	t.Helper()
	tok, err := auth.Mint([]byte(devcluster.Secret), app, uid, room, tags, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func send(seq uint64, body, tagExpr string) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: seq, Type: "chat", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(body), TagExpr: tagExpr}}}
}

// TestCallbacksThroughCluster: logins and sends of real clients through a ChatLink, decided by
// a real HTTP backend (allow, deny, override tags, rewrite), and by the failure policies when
// the backend is dead.
func TestCallbacksThroughCluster(t *testing.T) {
	t.Parallel()
	rules := &rulesBackend{}
	srv := httptest.NewServer(rules)
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connections to it are refused

	fast := callback.AppConfig{Secret: secret, Timeout: time.Second}
	app := func(login, send string, lp, sp callback.Policy) callback.AppConfig {
		a := fast
		a.LoginURL, a.SendURL, a.LoginPolicy, a.SendPolicy = login, send, lp, sp
		return a
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1), withApps(appLoginClosed, appOpen, appSendClosed), withCallbacks(map[string]callback.AppConfig{
		devcluster.App: app(srv.URL+"/login", srv.URL+"/send", callback.FailClosed, callback.FailClosed),
		appLoginClosed: app(deadURL+"/login", "", callback.FailClosed, callback.FailOpen),
		appOpen:        app(deadURL+"/login", deadURL+"/send", callback.FailOpen, callback.FailOpen),
		appSendClosed:  app("", deadURL+"/send", callback.FailOpen, callback.FailClosed),
	}))
	ws := c.Nodes[0].WSURL()
	dial := func(app, uid string, tags ...string) *testkit.Client {
		cl := testkit.DialWS(t, ws)
		cl.Login(token(t, app, uid, "r1", tags...))
		return cl
	}

	t.Run("login deny", func(t *testing.T) {
		m := testkit.DialWS(t, ws)
		f := m.LoginAs(token(t, devcluster.App, "mallory", "r1"), "test")
		if k := f.GetKick(); k == nil || k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_DENIED_BY_APP) || k.Reason != "mallory is not welcome" {
			t.Fatalf("want Kick 4011 with the app's reason, got %v", f)
		}
	})

	// alice's token has no tags and the app gives her vip; carol's says vip and the app
	// clears them; bob keeps his token's.
	alice := dial(devcluster.App, "alice")
	bob := dial(devcluster.App, "bob", "fan")
	carol := dial(devcluster.App, "carol", "vip")

	t.Run("override tags", func(t *testing.T) {
		bob.Send(send(1, "for vips", `"vip" in tags`))
		if ack := bob.Next().GetSendAck(); ack == nil {
			t.Fatal("no SendAck")
		}
		if msgs, _ := alice.CollectPushes(1); string(msgs[0].Body) != "for vips" {
			t.Fatalf("alice got %q", msgs[0].Body)
		}
		carol.ExpectSilence(300 * time.Millisecond)
	})

	t.Run("send deny", func(t *testing.T) {
		bob.Send(send(2, "buy spam now", ""))
		e := bob.Next().GetError()
		if e == nil || e.Seq != 2 || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_DENIED_BY_APP) || e.Message != "no spam here" {
			t.Fatalf("want Error 118 with the app's reason, got %v", e)
		}
		alice.ExpectSilence(200 * time.Millisecond)
	})

	t.Run("send rewrite", func(t *testing.T) {
		bob.Send(send(3, "darn it", ""))
		if ack := bob.Next().GetSendAck(); ack == nil || ack.Seq != 3 {
			t.Fatalf("want SendAck 3, got %v", ack)
		}
		for _, who := range []*testkit.Client{alice, carol} {
			msgs, _ := who.CollectPushes(1)
			if string(msgs[0].Body) != "****" || msgs[0].Type != "censored" || msgs[0].Sender != "bob" {
				t.Fatalf("got %q of type %q from %s, want **** of type censored from bob", msgs[0].Body, msgs[0].Type, msgs[0].Sender)
			}
		}
	})

	t.Run("send demote", func(t *testing.T) {
		// dave's token grants him the critical lane; the app lowers what he says "lower" in.
		dave := testkit.DialWS(t, ws)
		tok, err := auth.Mint([]byte(devcluster.Secret), devcluster.App, "dave", "r1", nil, time.Hour, auth.WithLanes(auth.LaneCritical))
		if err != nil {
			t.Fatal(err)
		}
		dave.Login(tok)
		for i, tc := range []struct{ from, to clientpb.Lane }{
			{clientpb.Lane_LANE_CRITICAL, clientpb.Lane_LANE_NORMAL},
			{clientpb.Lane_LANE_NORMAL, clientpb.Lane_LANE_BULK},
			{clientpb.Lane_LANE_CRITICAL, clientpb.Lane_LANE_CRITICAL}, // not said "lower": as sent
		} {
			body := fmt.Sprintf("lower %d", i)
			if tc.from == tc.to {
				body = fmt.Sprintf("as it is %d", i)
			}
			f := send(uint64(i+1), body, "")
			f.GetSend().Lane = tc.from
			dave.Send(f)
			if ack := dave.Next().GetSendAck(); ack == nil || ack.Seq != uint64(i+1) {
				t.Fatalf("want SendAck %d, got %v", i+1, ack)
			}
			for _, who := range []*testkit.Client{alice, bob, carol} {
				msgs, _ := who.CollectPushes(1)
				if string(msgs[0].Body) != body || msgs[0].Lane != tc.to {
					t.Fatalf("got %q on %v, want %q on %v", msgs[0].Body, msgs[0].Lane, body, tc.to)
				}
			}
		}
	})

	t.Run("server API sends are not called back", func(t *testing.T) {
		before := rules.sends.Load()
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/r1/messages", devcluster.APIKey, `{"body":"spam from the app itself"}`, nil); code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
		if msgs, _ := alice.CollectPushes(1); string(msgs[0].Body) != "spam from the app itself" {
			t.Fatalf("alice got %q", msgs[0].Body)
		}
		if n := rules.sends.Load(); n != before {
			t.Fatalf("the send hook was called %d times for an API send", n-before)
		}
	})

	t.Run("fail-closed login", func(t *testing.T) {
		m := testkit.DialWS(t, ws)
		f := m.LoginAs(token(t, appLoginClosed, "u", "r1"), "test")
		if k := f.GetKick(); k == nil || k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE) {
			t.Fatalf("want Kick 4504, got %v", f)
		}
	})

	t.Run("fail-open login and send", func(t *testing.T) {
		u := dial(appOpen, "u")
		v := dial(appOpen, "v")
		u.Send(send(1, "through anyway", ""))
		if ack := u.Next().GetSendAck(); ack == nil {
			t.Fatal("no SendAck")
		}
		if msgs, _ := v.CollectPushes(1); string(msgs[0].Body) != "through anyway" {
			t.Fatalf("v got %q", msgs[0].Body)
		}
	})

	t.Run("fail-closed send", func(t *testing.T) {
		u := dial(appSendClosed, "u")
		v := dial(appSendClosed, "v")
		u.Send(send(1, "held back", ""))
		if e := u.Next().GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE) {
			t.Fatalf("want Error 503, got %v", e)
		}
		v.ExpectSilence(200 * time.Millisecond)
	})

	bobLogin, _ := rules.bobLogin.Load().(callback.LoginRequest)
	if bobLogin.Hook != callback.HookLogin || bobLogin.App != devcluster.App || bobLogin.Room != "r1" || bobLogin.Device != "test" ||
		bobLogin.Node != "cl-1" || bobLogin.SessionID == "" || len(bobLogin.ID) != 32 || strings.Join(bobLogin.Tags, ",") != "fan" {
		t.Fatalf("bob's login request %+v: want hook, app, room, device test, node, session, id and the token's tags", bobLogin)
	}
	if n := rules.bad.Load(); n != 0 {
		t.Fatalf("%d callback requests did not verify", n)
	}
	if rules.logins.Load() != 5 { // mallory, alice, bob, carol, dave
		t.Fatalf("login hook called %d times, want 5", rules.logins.Load())
	}
}
