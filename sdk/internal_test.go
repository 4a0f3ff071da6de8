package sdk

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

func TestReadClaims(t *testing.T) {
	t.Parallel()
	tok, err := auth.Mint([]byte("secret"), "demo", "u-1", "room_1", []string{"vip"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := readClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c != (tokenClaims{App: "demo", UID: "u-1", Room: "room_1"}) {
		t.Errorf("claims = %+v", c)
	}

	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{
		"",
		"one.two",
		"a.!!!.c",
		"a." + enc("not json") + ".c",
		"a." + enc(`{"app":"demo","uid":"u"}`) + ".c", // no room
	} {
		if _, err := readClaims(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("readClaims(%q) err = %v, want ErrBadToken", bad, err)
		}
	}
}

func FuzzReadClaims(f *testing.F) {
	f.Add("a.eyJhcHAiOiJkZW1vIiwidWlkIjoidSIsInJvb20iOiJyIn0.c")
	f.Add("..")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := readClaims(tok)
		if err == nil && (c.App == "" || c.UID == "" || c.Room == "") {
			t.Errorf("readClaims(%q) = %+v with empty claims and no error", tok, c)
		}
	})
}

func TestTCPFrameRoundTrip(t *testing.T) {
	t.Parallel()
	frames := []*clientpb.Frame{
		{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: "t", Device: "d", Client: ClientName}}},
		{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 7, Body: bytes.Repeat([]byte("x"), 10000)}}},
		{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 1}}},
	}
	var stream []byte
	for _, f := range frames {
		var err error
		if stream, err = appendTCPFrame(stream, f); err != nil {
			t.Fatal(err)
		}
	}
	r := bytes.NewReader(stream)
	var buf []byte
	for i, want := range frames {
		got, err := readTCPFrame(r, &buf)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("frame %d = %v, want %v", i, got, want)
		}
	}
	if _, err := readTCPFrame(r, &buf); !errors.Is(err, io.EOF) {
		t.Errorf("after the last frame: err = %v, want EOF", err)
	}
}

func TestTCPFrameLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		input []byte
		want  error
	}{
		{"zero length", []byte{0, 0, 0, 0}, ErrProtocol},
		{"too long", []byte{0, 1, 0, 1}, ErrProtocol},
		{"truncated", []byte{0, 0, 0, 5, 1, 2}, io.ErrUnexpectedEOF},
		{"garbage", []byte{0, 0, 0, 2, 0xff, 0xff}, ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf []byte
			if _, err := readTCPFrame(bytes.NewReader(tc.input), &buf); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func FuzzReadTCPFrame(f *testing.F) {
	good, _ := appendTCPFrame(nil, &clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{
		Messages: []*clientpb.Message{{Id: "x", Body: []byte("hi")}},
	}}})
	f.Add(good)
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, input []byte) {
		var buf []byte
		r := bytes.NewReader(input)
		for {
			if _, err := readTCPFrame(r, &buf); err != nil {
				return
			}
		}
	})
}

func TestCloseErrorTerminal(t *testing.T) {
	t.Parallel()
	for code, want := range map[uint32]bool{4001: true, 4007: true, 4499: true, 4500: false, 4504: false, 1000: false, 1006: false, 1009: false} {
		if got := (&CloseError{Code: code}).Terminal(); got != want {
			t.Errorf("CloseError{%d}.Terminal() = %v, want %v", code, got, want)
		}
	}
}

// TestDispatchConnectionReuse checks who decides about the dispatch connection: with the
// default client each request closes its connection; with a client the caller gives, that
// client's Transport may keep it for the next dispatch.
func TestDispatchConnectionReuse(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	conns := map[string]bool{} // remote addresses seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		_, _ = io.WriteString(w, `{"nodes":[{"node":"cl-1","ws_url":"ws://127.0.0.1:1/v1/ws"}],"ttl_ms":1000}`)
	}))
	defer srv.Close()
	claims := tokenClaims{App: "demo", UID: "u", Room: "r"}
	seen := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := len(conns)
		clear(conns)
		return n
	}

	def, err := Config{Token: "t", Dispatcher: srv.URL}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := dispatch(context.Background(), def.HTTPClient, def.closeDispatch, srv.URL, claims); err != nil {
			t.Fatal(err)
		}
	}
	if n := seen(); n != 3 {
		t.Errorf("default client: 3 dispatches used %d connections, want 3 (one each, closed)", n)
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	own, err := Config{Token: "t", Dispatcher: srv.URL, HTTPClient: hc}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := dispatch(context.Background(), own.HTTPClient, own.closeDispatch, srv.URL, claims); err != nil {
			t.Fatal(err)
		}
	}
	if n := seen(); n != 1 {
		t.Errorf("caller's client: 3 dispatches used %d connections, want 1 (kept)", n)
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	const dispatcher = "http://127.0.0.1:1"
	hc := &http.Client{}
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: Config{Token: "t", Dispatcher: dispatcher}, Check: func(t *testing.T, c Config) {
			if c.Transport != TransportWebSocket || c.Device != "go" || c.AttemptTimeout != 10*time.Second ||
				c.WriteTimeout != 10*time.Second || c.MessageBuffer != 4096 || c.Logger == nil || c.Dialer == nil {
				t.Errorf("defaults not filled: %+v", c)
			}
			if c.HTTPClient != http.DefaultClient || !c.closeDispatch {
				t.Error("no HTTPClient should mean http.DefaultClient, closing its dispatch connection")
			}
		}},
		{Name: "set values are kept", Config: Config{Token: "t", Dispatcher: dispatcher, Transport: TransportTCP, Device: "ios",
			HTTPClient: hc, AttemptTimeout: time.Second, WriteTimeout: 2 * time.Second, MessageBuffer: 7},
			Check: func(t *testing.T, c Config) {
				if c.Transport != TransportTCP || c.Device != "ios" || c.HTTPClient != hc || c.closeDispatch ||
					c.AttemptTimeout != time.Second || c.WriteTimeout != 2*time.Second || c.MessageBuffer != 7 {
					t.Errorf("set values changed: %+v", c)
				}
			}},
		{Name: "endpoints instead of a dispatcher", Config: Config{Token: "t", Endpoints: []Endpoint{{Node: "cl-1"}}}},
		{Name: "unknown transport", Config: Config{Token: "t", Dispatcher: dispatcher, Transport: "quic"}, WantErr: `unknown transport "quic"`},
		{Name: "no token", Config: Config{Dispatcher: dispatcher}, WantErr: "no token"},
		{Name: "nowhere to dial", Config: Config{Token: "t"}, WantErr: "needs Dispatcher or Endpoints"},
	})
}
