package api_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// nextPush returns the next Push cl receives within d, skipping other frames; nil if none comes.
func nextPush(cl *testkit.Client, d time.Duration) *clientpb.Push {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case f := <-cl.Frames():
			if p := f.GetPush(); p != nil {
				return p
			}
		case <-timer.C:
			return nil
		}
	}
}

// withOtherApp adds a second app, "other", with its API key and token secret, and sends the
// audit trail to audit.
func withOtherApp(audit *testkit.Buffer) testcluster.Option {
	return func(cfg *devcluster.Config) {
		cfg.API.Keys = auth.APIKeys{devcluster.APIKey: {App: devcluster.App}, "other-key": {App: "other"}}
		cfg.ChatLink.Keys = auth.Keyring{devcluster.App: []byte(devcluster.Secret), "other": []byte("other-secret")}
		cfg.API.Audit = slog.New(slog.NewJSONHandler(audit, nil))
	}
}

// TestSendToAllRooms: an app-wide notice reaches the members of every room of the app on both
// ChatLinks, each member once with its own room named; members of another app's room of the
// same name do not get it; it is not in the rooms' history; the call is audited. Over gRPC with
// a negative spread it comes at once; a spread over a minute is refused.
func TestSendToAllRooms(t *testing.T) {
	t.Parallel()
	var audit testkit.Buffer
	c := testcluster.Start(t, testcluster.ChatLinks(2), withOtherApp(&audit))
	n1, n2 := c.Nodes[0].TCPAddr(), c.Nodes[1].TCPAddr()
	type seat struct {
		cl   *testkit.Client
		room string
	}
	var seats []seat
	for _, at := range []struct{ addr, uid, room string }{
		{n1, "a", "r1"}, {n1, "b", "r2"}, {n2, "c", "r1"}, {n2, "d", "r3"}, {n2, "e", "r2"}, {n1, "f", "r4"},
	} {
		cl, _ := member(t, at.addr, at.uid, at.room)
		seats = append(seats, seat{cl, at.room})
	}
	// The other app's member of a room called r1, on the first node.
	tok, err := auth.Mint([]byte("other-secret"), "other", "mallory", "r1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	outsider := testkit.DialTCP(t, n1)
	if f := outsider.LoginAs(tok, "web"); f.GetLoginAck() == nil {
		t.Fatalf("the other app's member: %v", f)
	}

	out := mustHTTP(t, c, 200, "POST", "/v1/rooms/messages", `{"type":"notice","lane":"critical","body":"maintenance at 2","spread_ms":400}`)
	id, _ := out["id"].(string)
	if id == "" || out["spread_ms"].(float64) != 400 {
		t.Fatalf("POST /v1/rooms/messages: %v", out)
	}
	for i, s := range seats {
		p := nextPush(s.cl, 10*time.Second)
		if p == nil || len(p.Messages) != 1 {
			t.Fatalf("member %d of %s: want the notice, got %v", i, s.room, p)
		}
		m := p.Messages[0]
		if m.Id != id || m.Room != s.room || string(m.Body) != "maintenance at 2" || m.Type != "notice" || m.Lane != clientpb.Lane_LANE_CRITICAL || m.RoomSeq != 0 {
			t.Errorf("member %d of %s got %v", i, s.room, m)
		}
	}
	if p := nextPush(outsider, 300*time.Millisecond); p != nil {
		t.Errorf("the other app's member of a room r1 got %v", p)
	}
	for _, s := range seats {
		if p := nextPush(s.cl, 50*time.Millisecond); p != nil {
			t.Errorf("a member of %s got a second push: %v", s.room, p)
		}
	}
	page := mustHTTP(t, c, 200, "GET", "/v1/rooms/r1/history", "")
	if strings.Contains(fmt.Sprint(page["messages"]), id) {
		t.Errorf("the notice is in r1's history: %v", page)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, line := range strings.Split(audit.String(), "\n") {
			if strings.Contains(line, `"method":"POST /v1/rooms/messages"`) && strings.Contains(line, `"result":"OK"`) && strings.Contains(line, `"app":"demo"`) {
				return nil
			}
		}
		return fmt.Errorf("no audit record of the notice:\n%s", audit.String())
	})

	// gRPC, at once.
	g := grpcClient(t, c)
	resp, err := g.SendToAllRooms(devCtx(), &apipb.SendToAllRoomsRequest{Type: "notice", Body: "now", SpreadMs: -1})
	if err != nil || resp.SpreadMs != 0 || resp.Id == "" {
		t.Fatalf("SendToAllRooms: %v %v", resp, err)
	}
	for i, s := range seats {
		p := nextPush(s.cl, 10*time.Second)
		if p == nil || len(p.Messages) != 1 || p.Messages[0].Id != resp.Id || p.Messages[0].Lane != clientpb.Lane_LANE_NORMAL {
			t.Fatalf("member %d of %s: want the second notice, got %v", i, s.room, p)
		}
	}
	if _, err := g.SendToAllRooms(devCtx(), &apipb.SendToAllRoomsRequest{Body: "x", SpreadMs: 60001}); grpcErrorCode(err) != "BAD_REQUEST" {
		t.Errorf("a spread over a minute: %v, want BAD_REQUEST", err)
	}
	if _, err := g.SendToAllRooms(devCtx(), &apipb.SendToAllRoomsRequest{}); grpcErrorCode(err) != "BAD_REQUEST" {
		t.Errorf("an empty notice: %v, want BAD_REQUEST", err)
	}
}

// TestSendToSession: a message to one session reaches that session and not the user's other
// one (on the other ChatLink); HTTP and gRPC alike. A session that has ended, one of another
// user, one of a node that does not run, and one that never was are USER_NOT_FOUND; an id that
// is not a session id is BAD_REQUEST. The call is audited with the session.
func TestSendToSession(t *testing.T) {
	t.Parallel()
	var audit testkit.Buffer
	c := testcluster.Start(t, testcluster.ChatLinks(2), withOtherApp(&audit))
	phone, phoneAck := member(t, c.Nodes[0].TCPAddr(), "alice", "r1")
	laptop, laptopAck := member(t, c.Nodes[1].TCPAddr(), "alice", "r2")
	_, bobAck := member(t, c.Nodes[1].TCPAddr(), "bob", "r2")

	out := mustHTTP(t, c, 200, "POST", "/v1/users/alice/sessions/"+laptopAck.SessionId+"/messages", `{"type":"dm","body":"on the laptop"}`)
	id, _ := out["id"].(string)
	p := nextPush(laptop, 10*time.Second)
	if p == nil || len(p.Messages) != 1 || p.Messages[0].Id != id || string(p.Messages[0].Body) != "on the laptop" || p.Messages[0].Room != "" {
		t.Fatalf("the laptop wants the message %s, got %v", id, p)
	}
	g := grpcClient(t, c)
	resp, err := g.SendToSession(devCtx(), &apipb.SendToSessionRequest{Uid: "alice", SessionId: phoneAck.SessionId, Type: "dm", Body: "on the phone", Lane: "critical"})
	if err != nil {
		t.Fatalf("SendToSession: %v", err)
	}
	p = nextPush(phone, 10*time.Second)
	if p == nil || len(p.Messages) != 1 || p.Messages[0].Id != resp.Id || p.Messages[0].Lane != clientpb.Lane_LANE_CRITICAL {
		t.Fatalf("the phone wants the message %s, got %v", resp.Id, p)
	}
	if p := nextPush(phone, 200*time.Millisecond); p != nil {
		t.Errorf("the phone got the laptop's message too: %v", p)
	}
	if p := nextPush(laptop, 50*time.Millisecond); p != nil {
		t.Errorf("the laptop got the phone's message too: %v", p)
	}

	node := c.Nodes[1].Name()
	for _, tc := range []struct {
		name, uid, session string
		status, code       int
	}{
		{"another user's session", "alice", bobAck.SessionId, 404, 107},
		{"a session that never was", "alice", node + "-zzzzzzzzzz", 404, 107},
		{"a node that does not run", "alice", "cl-99-1", 404, 107},
		{"the other app's key", "alice", laptopAck.SessionId, 404, 107},
		{"not a session id", "alice", "nodash", 400, 100},
	} {
		key := devcluster.APIKey
		if strings.HasPrefix(tc.name, "the other app") {
			key = "other-key"
		}
		var got struct {
			Code int `json:"code"`
		}
		if status := testcluster.Call(t, c, "POST", "/v1/users/"+tc.uid+"/sessions/"+tc.session+"/messages", key, `{"body":"x"}`, &got); status != tc.status || got.Code != tc.code {
			t.Errorf("%s: HTTP %d code %d, want %d code %d", tc.name, status, got.Code, tc.status, tc.code)
		}
	}
	laptop.Close()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		_, err := g.SendToSession(devCtx(), &apipb.SendToSessionRequest{Uid: "alice", SessionId: laptopAck.SessionId, Body: "gone?"})
		if grpcErrorCode(err) != "USER_NOT_FOUND" {
			return fmt.Errorf("a session that ended: %v, want USER_NOT_FOUND", err)
		}
		return nil
	})
	if !strings.Contains(audit.String(), `"session_id":"`+laptopAck.SessionId+`"`) {
		t.Errorf("the audit trail does not name the session:\n%s", audit.String())
	}
}
