package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"roomcast/callback"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

var secret = []byte("example-callback-secret-42")

// TestAgainstCluster: the example's verification accepts what Roomcast sends, and its rules
// reach real clients.
func TestAgainstCluster(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newBackend(secret, "mallory"))
	defer srv.Close()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.Callbacks.Apps = map[string]callback.AppConfig{devcluster.App: {
			LoginURL: srv.URL + "/login", SendURL: srv.URL + "/send", Secret: secret,
			LoginPolicy: callback.FailClosed, SendPolicy: callback.FailClosed,
		}}
	})
	ws := c.Nodes[0].WSURL()

	m := testkit.DialWS(t, ws)
	if k := m.LoginAs(testcluster.Token(t, "mallory", "r"), "test").GetKick(); k == nil ||
		k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_DENIED_BY_APP) || k.Reason != "this account is suspended" {
		t.Fatalf("mallory: %v", k)
	}
	host := testkit.DialWS(t, ws)
	host.Login(testcluster.Token(t, "host1", "r"))
	guest := testkit.DialWS(t, ws)
	guest.Login(testcluster.Token(t, "guest", "r"))

	// The host's tag role:host came from the backend: a message for hosts reaches it alone.
	sendFrame := func(seq uint64, body, expr string) *clientpb.Frame {
		return &clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: seq, Type: "chat", Body: []byte(body), TagExpr: expr}}}
	}
	guest.Send(sendFrame(1, "hosts only", `"role:host" in tags`))
	if ack := guest.Next().GetSendAck(); ack == nil {
		t.Fatal("no SendAck")
	}
	if msgs, _ := host.CollectPushes(1); string(msgs[0].Body) != "hosts only" {
		t.Fatalf("host got %q", msgs[0].Body)
	}

	guest.Send(sendFrame(2, "see https://spam.example", ""))
	if e := guest.Next().GetError(); e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_DENIED_BY_APP) || e.Message != "links are not allowed here" {
		t.Fatalf("link: %v", e)
	}
	guest.Send(sendFrame(3, "darn it", ""))
	if ack := guest.Next().GetSendAck(); ack == nil || ack.Seq != 3 {
		t.Fatalf("want SendAck 3, got %v", ack)
	}
	if msgs, _ := host.CollectPushes(1); string(msgs[0].Body) != "**** it" {
		t.Fatalf("host got %q, want the rewrite", msgs[0].Body)
	}
}

// TestRefusesForgedAndReplayed: a request signed with another secret, altered, stale, or sent
// twice is refused.
func TestRefusesForgedAndReplayed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newBackend(secret))
	defer srv.Close()
	now := time.Now()
	post := func(body string, ts int64, sig string) int {
		req, _ := http.NewRequest("POST", srv.URL+"/login", bytes.NewReader([]byte(body)))
		req.Header.Set(callback.HeaderTimestamp, fmt.Sprint(ts))
		req.Header.Set(callback.HeaderSignature, sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	body := `{"hook":"login","id":"0123","uid":"u"}`
	for _, tc := range []struct {
		name string
		body string
		ts   int64
		sig  string
		want int
	}{
		{"good", body, now.Unix(), callback.Sign(secret, now.Unix(), []byte(body)), 200},
		{"replayed", body, now.Unix(), callback.Sign(secret, now.Unix(), []byte(body)), 401},
		{"other secret", body, now.Unix(), callback.Sign([]byte("not the app's secret!"), now.Unix(), []byte(body)), 401},
		{"altered", `{"hook":"login","id":"0124","uid":"admin"}`, now.Unix(), callback.Sign(secret, now.Unix(), []byte(body)), 401},
		{"stale", body, now.Add(-10 * time.Minute).Unix(), callback.Sign(secret, now.Add(-10*time.Minute).Unix(), []byte(body)), 401},
	} {
		if got := post(tc.body, tc.ts, tc.sig); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
}
