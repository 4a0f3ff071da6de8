package chatlink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// sseClient reads a ChatLink's SSE stream (transport_sse.go) and posts frames to it.
type sseClient struct {
	t      *testing.T
	base   string // http://host:port/v1/sse
	key    string
	frames chan *clientpb.Frame
	ended  chan struct{}
	cancel context.CancelFunc
}

// sseURL is the SSE path on the WebSocket listener of a node whose WebSocket URL is ws.
func sseURL(ws string) string {
	return strings.Replace(strings.TrimSuffix(ws, "/v1/ws"), "ws://", "http://", 1) + "/v1/sse"
}

// dialSSE opens a stream that logs in with login and waits for its key.
func dialSSE(t *testing.T, ws string, login *clientpb.Frame) *sseClient {
	t.Helper()
	b, err := proto.Marshal(login)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &sseClient{t: t, base: sseURL(ws), frames: make(chan *clientpb.Frame, 100), ended: make(chan struct{}), cancel: cancel}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"?login="+base64.RawURLEncoding.EncodeToString(b), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		cancel()
		t.Fatalf("stream answered %s %v", resp.Status, resp.Header)
	}
	keys := make(chan string, 1)
	go func() {
		defer close(c.ended)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var event string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "stream":
				keys <- strings.TrimPrefix(line, "data: ")
			case strings.HasPrefix(line, "data: "):
				raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(line, "data: "))
				var f clientpb.Frame
				if err != nil || proto.Unmarshal(raw, &f) != nil {
					t.Errorf("event %q does not hold a frame", line)
					return
				}
				c.frames <- &f
			case line == "":
				event = ""
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-c.ended })
	select {
	case c.key = <-keys:
	case <-time.After(5 * time.Second):
		t.Fatal("no stream key in 5s")
	}
	return c
}

func (c *sseClient) next() *clientpb.Frame {
	c.t.Helper()
	select {
	case f := <-c.frames:
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatal("no frame in the stream in 5s")
		return nil
	}
}

// post sends one frame and returns the HTTP status.
func (c *sseClient) post(key string, body []byte) int {
	c.t.Helper()
	resp, err := http.Post(c.base+"/"+key, "application/x-protobuf", bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (c *sseClient) postFrame(f *clientpb.Frame) {
	c.t.Helper()
	b, _ := proto.Marshal(f)
	if code := c.post(c.key, b); code != http.StatusNoContent {
		c.t.Fatalf("post answered %d", code)
	}
}

// expectEnd waits for the server to end the stream.
func (c *sseClient) expectEnd() {
	c.t.Helper()
	select {
	case <-c.ended:
	case <-time.After(5 * time.Second):
		c.t.Fatal("the stream did not end in 5s")
	}
}

// The HTTP fallback: a member that logs in over SSE gets what a WebSocket member gets, sends and
// beats by POST, and is closed with a Kick in the stream.
func TestSSEMember(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]

	viewer := dialSSE(t, node.WSURL(), loginFrame(testcluster.Token(t, "viewer", "sse")))
	ack := viewer.next().GetLoginAck()
	if ack == nil || ack.Room != "sse" || ack.Uid != "viewer" {
		t.Fatalf("want a LoginAck for viewer in sse, got %v", ack)
	}

	ws := testkit.DialWS(t, node.WSURL())
	ws.Login(testcluster.Token(t, "talker", "sse"))
	ws.Send(sendFrame(1, "over the websocket"))
	if ws.Next().GetSendAck() == nil {
		t.Fatal("the WebSocket send was not acknowledged")
	}
	if p := viewer.next().GetPush(); p == nil || string(p.Messages[0].Body) != "over the websocket" {
		t.Fatalf("the SSE member did not get the push: %v", p)
	}

	viewer.postFrame(sendFrame(7, "over http"))
	if a := viewer.next().GetSendAck(); a == nil || a.Seq != 7 || a.MessageId == "" {
		t.Fatalf("want the SendAck for seq 7 in the stream, got %v", a)
	}
	if p := ws.Next().GetPush(); p == nil || string(p.Messages[0].Body) != "over http" {
		t.Fatalf("the WebSocket member did not get the SSE member's message: %v", p)
	}
	viewer.postFrame(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 42}}})
	if a := viewer.next().GetHeartbeatAck(); a == nil || a.ClientTimeMs != 42 {
		t.Fatalf("want a HeartbeatAck, got %v", a)
	}

	if code := viewer.post("0123456789abcdef0123456789abcdef", []byte{1}); code != http.StatusNotFound {
		t.Fatalf("a post to an unknown stream: %d, want 404", code)
	}
	req, _ := http.NewRequest(http.MethodOptions, viewer.base+"/"+viewer.key, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Content-Type") {
		t.Fatalf("preflight answered %s %v", resp.Status, resp.Header)
	}

	// A second Login is a protocol error: BAD_FRAME, in the stream, which then ends.
	viewer.postFrame(loginFrame(testcluster.Token(t, "viewer", "sse")))
	if k := viewer.next().GetKick(); k == nil || k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME) {
		t.Fatalf("want Kick BAD_FRAME, got %v", k)
	}
	viewer.expectEnd()
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if n := node.Connections(); n != 1 {
			return fmt.Errorf("%d connections, want the WebSocket one", n)
		}
		return nil
	})
}

// A stream whose login is refused gets the Kick and ends; one without a login is a bad request.
func TestSSEBadLogin(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	s := dialSSE(t, c.Nodes[0].WSURL(), loginFrame("not.a.token"))
	if k := s.next().GetKick(); k == nil || k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
		t.Fatalf("want Kick BAD_TOKEN, got %v", k)
	}
	s.expectEnd()

	resp, err := http.Get(sseURL(c.Nodes[0].WSURL()) + "?login=***")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a stream without a login: %s, want 400", resp.Status)
	}
}

// A node that shuts down ends its streams with SHUTDOWN, like its WebSocket connections.
func TestSSEShutdown(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	s := dialSSE(t, c.Nodes[0].WSURL(), loginFrame(testcluster.Token(t, "u", "r")))
	if s.next().GetLoginAck() == nil {
		t.Fatal("no LoginAck")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Nodes[0].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if k := s.next().GetKick(); k == nil || k.Code != uint32(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("want Kick SHUTDOWN, got %v", k)
	}
	s.expectEnd()
}

// The SSE path is told from WebSocket upgrades by the request line alone, without waiting for
// bytes a short request never sends.
func TestIsSSERequest(t *testing.T) {
	t.Parallel()
	for req, want := range map[string]bool{
		"GET /v1/sse?login=x HTTP/1.1\r\n": true,
		"POST /v1/sse/abc HTTP/1.1\r\n":    true,
		"OPTIONS /v1/sse/abc HTTP/1.1\r\n": true,
		"GET /v1/ws HTTP/1.1\r\n":          false,
		"GET /v1/ssex HTTP/1.1\r\n":        false,
		"GET /v1/s":                        false, // then EOF: not enough to tell
		"\x16\x03\x01\x02\x00\x01\x00\x01": false,
	} {
		if got := chatlink.IsSSERequest(bufio.NewReader(strings.NewReader(req))); got != want {
			t.Errorf("%q: %v, want %v", req, got, want)
		}
	}
}

// A POST that announces a body and never sends it is answered and closed after the handshake
// timeout (5 s) instead of holding its connection open.
func TestSSESlowBody(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]
	viewer := dialSSE(t, node.WSURL(), loginFrame(testcluster.Token(t, "viewer", "slow")))
	if viewer.next().GetLoginAck() == nil {
		t.Fatal("no LoginAck")
	}
	host, _, _ := strings.Cut(strings.TrimPrefix(viewer.base, "http://"), "/")
	nc, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "POST /v1/sse/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", viewer.key)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(nc) // an answer, then the close; or the deadline
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection was still open after %v", time.Since(start))
	}
}
