package chatlink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// clientFrameSeeds are frames of every kind a client sends, well-formed and not, and a kind
// only the server sends.
func clientFrameSeeds(t testing.TB) [][]byte {
	frames := []*clientpb.Frame{
		{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 1, Type: "chat", Body: []byte("hi"), TagExpr: `"vip" in tags`}}},
		{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: 2, Lane: clientpb.Lane_LANE_CRITICAL, TagExpr: `((((`}}},
		{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 1}}},
		{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 3, Limit: 500, Cursor: "AQEC"}}},
		{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: &clientpb.HistoryQuery{Seq: 4, BeforeId: "x", AfterId: "y"}}},
		{Kind: &clientpb.Frame_Ack{Ack: &clientpb.Ack{Ids: []string{"01M8SEH328APM47SJZNEDM4DQP"}}}},
		{Kind: &clientpb.Frame_Ack{Ack: &clientpb.Ack{}}},
		{Kind: &clientpb.Frame_QueueRequest{QueueRequest: &clientpb.RoomQueueRequest{Seq: 5, Op: clientpb.QueueOp_QUEUE_OP_OFFER, Key: "k", Value: []byte("v"), IfAbsent: true}}},
		{Kind: &clientpb.Frame_QueueRequest{QueueRequest: &clientpb.RoomQueueRequest{Seq: 6, Op: clientpb.QueueOp(99)}}},
		{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: &clientpb.ModerateRequest{Seq: 7, Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "someone", DurationMs: 1000}}},
		{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: &clientpb.ModerateRequest{Seq: 8, Op: clientpb.ModerateOp(42), Uid: "a b", DurationMs: -1, Reason: "r"}}},
		{Kind: &clientpb.Frame_ModerateReply{ModerateReply: &clientpb.ModerateReply{Seq: 9}}},
		{Kind: &clientpb.Frame_RecallRequest{RecallRequest: &clientpb.RecallRequest{Seq: 7, MessageId: "01M8SEH328APM47SJZNEDM4DQP"}}},
		{Kind: &clientpb.Frame_RecallRequest{RecallRequest: &clientpb.RecallRequest{Seq: 8, MessageId: "not an id"}}},
		{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: "again"}}},
		{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{SessionId: "s"}}},
	}
	var seeds [][]byte
	for _, f := range frames {
		b, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return append(seeds, nil, []byte{0xff, 0xff, 0xff}, []byte{0x1a, 0x80, 0x80, 0x80, 0x80, 0x10})
}

// FuzzClientFrame sends any bytes as one frame of a logged-in member, over TCP, then a
// Heartbeat. Every frame the node answers with parses, and the node either answers the
// Heartbeat or closes the connection with a Kick carrying a documented close code: it never
// crashes, hangs or answers garbage.
func FuzzClientFrame(f *testing.F) {
	for _, s := range clientFrameSeeds(f) {
		f.Add(s)
	}
	c := testcluster.Start(f, testcluster.ChatLinks(1))
	addr, tok := c.Nodes[0].TCPAddr(), testcluster.Token(f, "fuzz", "fuzz")
	f.Fuzz(func(t *testing.T, frame []byte) {
		cl := testkit.DialTCP(t, addr)
		cl.Login(tok)
		if err := cl.SendPayload(frame); err != nil {
			t.Fatal(err)
		}
		// The node may close before it reads the Heartbeat.
		_ = cl.SendPayload(heartbeat)
		timeout := time.After(5 * time.Second)
		for {
			select {
			case fr := <-cl.Frames():
				if fr.GetHeartbeatAck().GetClientTimeMs() == 42 {
					return
				}
				if k := fr.GetKick(); k != nil {
					if _, ok := clientpb.CloseCode_name[int32(k.Code)]; !ok {
						t.Fatalf("kicked with an undocumented code: %v", k)
					}
					return
				}
			case <-cl.Done():
				return // closed at the TCP framing (a length of zero or too large): no frame to answer with
			case <-timeout:
				t.Fatal("neither an answer to the Heartbeat nor a close in 5s")
			}
		}
	})
}

var heartbeat = func() []byte {
	b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 42}}})
	return b
}()

// FuzzSSE opens an SSE stream with any login parameter and posts any body to it
// (transport_sse.go): the node answers a login it cannot decode with 400, and otherwise a stream
// whose events each hold a frame, the first a LoginAck or a Kick; a POST is answered with 204 or
// 413, and what it sets off comes in the stream, or the stream ends.
func FuzzSSE(f *testing.F) {
	login := func(tok string) string {
		b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: tok, Device: "web"}}})
		return base64.RawURLEncoding.EncodeToString(b)
	}
	valid := login(testcluster.Token(f, "fuzz", "fuzz"))
	for _, s := range clientFrameSeeds(f) {
		f.Add(valid, s)
	}
	f.Add(valid+"==", heartbeat)
	f.Add(login("not.a.token"), heartbeat)
	f.Add("***", heartbeat)
	f.Add("", []byte(nil))
	f.Add(base64.RawURLEncoding.EncodeToString(heartbeat), heartbeat) // not a Login first
	c := testcluster.Start(f, testcluster.ChatLinks(1))
	base := strings.Replace(strings.TrimSuffix(c.Nodes[0].WSURL(), "/v1/ws"), "ws://", "http://", 1) + "/v1/sse"

	f.Fuzz(func(t *testing.T, loginParam string, post []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"?login="+url.QueryEscape(loginParam), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusBadRequest:
			_, _ = io.Copy(io.Discard, resp.Body) // so the connection serves the next request, rather than a new port each
			return
		case http.StatusOK:
		default:
			t.Fatalf("GET: %s", resp.Status)
		}
		events := bufio.NewReader(resp.Body)
		key, err := sseEvent(events)
		if err != nil || !strings.HasPrefix(key, "stream\n") {
			t.Fatalf("first event %q, %v: want the stream's key", key, err)
		}
		key = strings.TrimPrefix(key, "stream\n")
		first, err := sseFrame(events)
		if err != nil {
			t.Fatal(err)
		}
		if first.GetLoginAck() == nil && first.GetKick() == nil {
			t.Fatalf("the login's answer: %v", first)
		}
		if first.GetKick() != nil {
			if _, err := sseFrame(events); err != io.EOF {
				t.Fatalf("the stream goes on after its Kick: %v", err)
			}
			return
		}
		postFrame := func(body []byte) int {
			preq, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/"+key, bytes.NewReader(body))
			presp, err := http.DefaultClient.Do(preq)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, presp.Body)
			presp.Body.Close()
			return presp.StatusCode
		}
		if st := postFrame(post); st != http.StatusNoContent && st != http.StatusRequestEntityTooLarge {
			t.Fatalf("POST: %d", st)
		}
		// Then a Heartbeat, to the stream if it is still there: its answer, a Kick or the
		// stream's end comes next, after what the fuzzed frame set off.
		if st := postFrame(heartbeat); st != http.StatusNoContent && st != http.StatusNotFound {
			t.Fatalf("POST of a Heartbeat: %d", st)
		}
		for {
			fr, err := sseFrame(events)
			switch {
			case err == io.EOF:
				return
			case err != nil:
				t.Fatal(err)
			case fr.GetHeartbeatAck().GetClientTimeMs() == 42:
				return
			case fr.GetKick() != nil:
				if _, ok := clientpb.CloseCode_name[int32(fr.GetKick().Code)]; !ok {
					t.Fatalf("kicked with an undocumented code: %v", fr)
				}
			}
		}
	})
}

// sseEvent reads one event of an SSE stream: its name (if any) and data, "name\ndata", or the
// data alone. Comment lines (keep-alives) are skipped.
func sseEvent(r *bufio.Reader) (string, error) {
	var name, data string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && data != "":
			if name != "" {
				return name + "\n" + data, nil
			}
			return data, nil
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// sseFrame reads the next event and decodes the frame it holds.
func sseFrame(r *bufio.Reader) (*clientpb.Frame, error) {
	ev, err := sseEvent(r)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(ev)
	if err != nil {
		return nil, err
	}
	var f clientpb.Frame
	if err := proto.Unmarshal(raw, &f); err != nil {
		return nil, err
	}
	return &f, nil
}
