package api_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/api"
	"roomcast/internal/auth"
	"roomcast/internal/testkit/testcluster"
)

// TestBodyTimeout: a request that announces a body and never sends it is answered 400 once
// BodyTimeout has passed, and its connection closed, whether its key is good (10 MiB
// announced) or not (1,000 bytes, which net/http would otherwise wait to read and discard
// after the 401); a body that arrives in time is served, and the deadline does not outlive it.
func TestBodyTimeout(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	a, err := api.New(api.Config{Bus: nc, Keys: auth.APIKeys{"k": {App: "demo"}}, BodyTimeout: time.Second}) // long enough beside the 100 ms slow client on a loaded machine
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, tc := range []struct {
		name, key, length, body, status string
	}{
		{"announced 10 MiB, sent nothing", "k", "10485760", "", "400"},
		{"bad key, announced 1000 bytes, sent nothing", "nope", "1000", "", "401"},
		{"body in time", "k", "12", `{"body":"x"}`, "200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = io.WriteString(nc, "POST /v1/rooms/lobby/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tc.key+
				"\r\nContent-Length: "+tc.length+"\r\n\r\n")
			if err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				time.Sleep(100 * time.Millisecond) // a slow client, within the timeout
				_, _ = io.WriteString(nc, tc.body)
			}
			br := bufio.NewReader(nc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if got := resp.Status[:3]; got != tc.status {
				t.Fatalf("HTTP %s %s, want %s", resp.Status, b, tc.status)
			}
			if tc.status == "200" {
				// The deadline does not outlive its request: the connection serves a next one
				// after it has passed.
				time.Sleep(1200 * time.Millisecond)
				_, _ = io.WriteString(nc, "GET /v1/rooms/lobby HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n")
				if _, err := http.ReadResponse(br, nil); err != nil {
					t.Fatalf("next request on the connection: %v", err)
				}
				return
			}
			// The server closes the connection rather than wait for the rest of the body.
			if _, err := br.ReadByte(); err != io.EOF && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("connection not closed after the answer: %v", err)
			}
		})
	}
}
