package api_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// TestAPICalls exercises every server API call over gRPC and over HTTP, and checks what the
// members see.
func TestAPICalls(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.LeaseInterval = 2, 100*time.Millisecond })
	g := grpcClient(t, c)
	ctx := devCtx()
	n1, n2 := c.Nodes[0].TCPAddr(), c.Nodes[1].TCPAddr()

	// CreateRoom: new, then again (idempotent), over both transports.
	cr, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "g1", Name: "gRPC room", Owner: "host", Settings: &roompb.RoomSettings{MaxMembers: 100}})
	if err != nil || !cr.Created || cr.Room.Status != apipb.RoomStatus_ROOM_STATUS_OPEN || cr.Room.CreatedMs == 0 {
		t.Fatalf("CreateRoom: %v %v", cr, err)
	}
	cr, err = g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "g1", Name: "another name"})
	if err != nil || cr.Created || cr.Room.Name != "gRPC room" {
		t.Fatalf("CreateRoom again: %v %v, want the existing room", cr, err)
	}
	out := mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"h1","name":"HTTP room","settings":{"max_members":5,"who_may_send":"SEND_POLICY_MEMBERS"}}`)
	if out["created"] != true || out["room"].(map[string]any)["status"] != "ROOM_STATUS_OPEN" {
		t.Fatalf("POST /v1/rooms: %v", out)
	}
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms", `{"room":"h1"}`)
	if out["created"] != false || out["room"].(map[string]any)["name"] != "HTTP room" {
		t.Fatalf("POST /v1/rooms again: %v", out)
	}

	// UpdateRoom.
	name := "renamed"
	r, err := g.UpdateRoom(ctx, &apipb.UpdateRoomRequest{Room: "g1", Name: &name})
	if err != nil || r.Name != "renamed" || r.Owner != "host" || r.Settings.MaxMembers != 100 {
		t.Fatalf("UpdateRoom: %v %v", r, err)
	}
	out = mustHTTP(t, c, 200, "PATCH", "/v1/rooms/h1", `{"owner":"boss","settings":{"max_members":7}}`)
	if out["owner"] != "boss" || out["settings"].(map[string]any)["max_members"].(float64) != 7 || out["name"] != "HTTP room" {
		t.Fatalf("PATCH /v1/rooms/h1: %v", out)
	}

	// Members in both rooms, on both nodes.
	ga, _ := member(t, n1, "ga", "g1", "team:red")
	gb, _ := member(t, n2, "gb", "g1", "team:blue")
	ha, _ := member(t, n1, "ha", "h1")
	hb, _ := member(t, n2, "hb", "h1")

	// GetRoom.
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		gr, err := g.GetRoom(ctx, &apipb.GetRoomRequest{Room: "g1"})
		if err != nil || gr.Online != 2 || gr.Nodes["cl-1"] != 1 || gr.Nodes["cl-2"] != 1 || gr.Meta.GetName() != "renamed" {
			return fmt.Errorf("GetRoom: %v %v", gr, err)
		}
		return nil
	})
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		out := mustHTTP(t, c, 200, "GET", "/v1/rooms/h1", "")
		if out["online"].(float64) != 2 || out["meta"].(map[string]any)["owner"] != "boss" {
			return fmt.Errorf("GET /v1/rooms/h1: %v", out)
		}
		return nil
	})

	// ListMembers.
	lm, err := g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "g1", Tag: "team:blue"})
	if err != nil || len(lm.Members) != 1 || lm.Members[0].Uid != "gb" || lm.Members[0].Node != "cl-2" || lm.NextPageToken != "" {
		t.Fatalf("ListMembers: %v %v", lm, err)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/rooms/h1/members?page_size=1", "")
	if len(out["members"].([]any)) != 1 || out["next_page_token"] == "" {
		t.Fatalf("GET members page 1: %v", out)
	}

	// SendToRoom.
	sr, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "g1", Type: "notice", Lane: "critical", Body: "hello g1"})
	if err != nil || len(sr.Id) != 26 {
		t.Fatalf("SendToRoom: %v %v", sr, err)
	}
	for _, m := range []*testkit.Client{ga, gb} {
		if msgs := m.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "hello g1" || msgs[0].Id != sr.Id {
			t.Fatalf("want the gRPC notice, got %v", msgs)
		}
	}
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/h1/messages", `{"body":"hello h1","sender":"host"}`)
	for _, m := range []*testkit.Client{ha, hb} {
		if msgs := m.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "hello h1" || msgs[0].Id != out["id"] {
			t.Fatalf("want the HTTP message, got %v", msgs)
		}
	}

	// SendBatchToRoom: in order, in one room batch; one bad message and none goes.
	br, err := g.SendBatchToRoom(ctx, &apipb.SendBatchToRoomRequest{Room: "g1", Messages: []*apipb.SendToRoomRequest{
		{Body: "b1", Lane: "critical"}, {Body: "b2", Lane: "critical"}, {Body: "b3", Lane: "critical"},
	}})
	if err != nil || len(br.Ids) != 3 || br.Ids[0] >= br.Ids[1] || br.Ids[1] >= br.Ids[2] {
		t.Fatalf("SendBatchToRoom: %v %v", br, err)
	}
	for _, m := range []*testkit.Client{ga, gb} {
		var got []string
		for len(got) < 3 {
			for _, msg := range m.Next().GetPush().GetMessages() {
				got = append(got, string(msg.Body)+"="+msg.Id)
			}
		}
		if want := []string{"b1=" + br.Ids[0], "b2=" + br.Ids[1], "b3=" + br.Ids[2]}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("batch arrived as %v, want %v", got, want)
		}
	}
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/h1/messages/batch", `{"messages":[{"body":"h-b1"},{"body":"h-b2","sender":"host"}]}`)
	if ids := out["ids"].([]any); len(ids) != 2 {
		t.Fatalf("POST /v1/rooms/h1/messages/batch: %v", out)
	}
	for _, m := range []*testkit.Client{ha, hb} {
		var got []string
		for len(got) < 2 {
			for _, msg := range m.Next().GetPush().GetMessages() {
				got = append(got, string(msg.Body))
			}
		}
		if strings.Join(got, ",") != "h-b1,h-b2" {
			t.Fatalf("HTTP batch arrived as %v", got)
		}
	}
	if _, err := g.SendBatchToRoom(ctx, &apipb.SendBatchToRoomRequest{Room: "g1", Messages: []*apipb.SendToRoomRequest{{Body: "fine"}, {Body: ""}}}); grpcErrorCode(err) != "BAD_REQUEST" || !strings.Contains(status.Convert(err).Message(), "message 1") {
		t.Fatalf("a batch with an empty message: %v", err)
	}
	if _, err := g.SendBatchToRoom(ctx, &apipb.SendBatchToRoomRequest{Room: "g1", Messages: []*apipb.SendToRoomRequest{{Body: "ok"}, {Body: "x", TagExpr: "len(tags) > 0"}}}); grpcErrorCode(err) != "BAD_TAG_EXPR" {
		t.Fatalf("a batch with a bad tag expression: %v", err)
	}
	mustHTTP(t, c, 400, "POST", "/v1/rooms/h1/messages/batch", `{"messages":[]}`)

	// SendToUsers: only the users named get it, wherever they are.
	su, err := g.SendToUsers(ctx, &apipb.SendToUsersRequest{Uids: []string{"gb", "nobody"}, Type: "dm", Body: "psst"})
	if err != nil || su.Sessions != 1 || len(su.Offline) != 1 || su.Offline[0] != "nobody" {
		t.Fatalf("SendToUsers: %v %v", su, err)
	}
	if msgs := gb.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "psst" || msgs[0].Room != "" {
		t.Fatalf("gb wants the direct message, got %v", msgs)
	}
	out = mustHTTP(t, c, 200, "POST", "/v1/users/messages", `{"uids":["ha"],"body_base64":"AAE="}`)
	if out["sessions"].(float64) != 1 {
		t.Fatalf("POST /v1/users/messages: %v", out)
	}
	if msgs := ha.Next().GetPush().GetMessages(); len(msgs) != 1 || string(msgs[0].Body) != "\x00\x01" {
		t.Fatalf("ha wants the direct message, got %v", msgs)
	}

	// GetUserSessions and CountOnline.
	us, err := g.GetUserSessions(ctx, &apipb.GetUserSessionsRequest{Uid: "ga"})
	if err != nil || !us.Online || len(us.Sessions) != 1 || us.Sessions[0].Room != "g1" || us.Sessions[0].Device != "web" {
		t.Fatalf("GetUserSessions: %v %v", us, err)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/users/nobody/sessions", "")
	if out["online"] != false || len(out["sessions"].([]any)) != 0 {
		t.Fatalf("sessions of an unknown user: %v", out)
	}
	co, err := g.CountOnline(ctx, &apipb.CountOnlineRequest{})
	if err != nil || co.Sessions != 4 || co.Users != 4 {
		t.Fatalf("CountOnline: %v %v", co, err)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/online", "")
	if out["sessions"].(float64) != 4 {
		t.Fatalf("GET /v1/online: %v", out)
	}

	// SetMemberTags and GetMemberTags: the online session takes the tags at once (member lists
	// filter on them), and they are stored.
	st, err := g.SetMemberTags(ctx, &apipb.SetMemberTagsRequest{Uid: "ga", Tags: []string{"team:green", "role:captain", "team:green"}})
	if err != nil || st.SessionsUpdated != 1 || strings.Join(st.Tags.Tags, ",") != "role:captain,team:green" {
		t.Fatalf("SetMemberTags: %v %v", st, err)
	}
	lm, err = g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "g1", Tag: "team:green"})
	if err != nil || len(lm.Members) != 1 || lm.Members[0].Uid != "ga" {
		t.Fatalf("members tagged team:green after SetMemberTags: %v %v", lm, err)
	}
	mt, err := g.GetMemberTags(ctx, &apipb.GetMemberTagsRequest{Uid: "ga"})
	if err != nil || len(mt.Tags) != 2 || mt.UpdatedMs == 0 {
		t.Fatalf("GetMemberTags: %v %v", mt, err)
	}
	out = mustHTTP(t, c, 200, "PUT", "/v1/users/hb/tags", `{"tags":["vip"]}`)
	if out["sessions_updated"].(float64) != 1 {
		t.Fatalf("PUT /v1/users/hb/tags: %v", out)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/users/hb/tags", "")
	if tags := out["tags"].([]any); len(tags) != 1 || tags[0] != "vip" {
		t.Fatalf("GET /v1/users/hb/tags: %v", out)
	}
	mustHTTP(t, c, 404, "GET", "/v1/users/nobody/tags", "")
	mustHTTP(t, c, 400, "PUT", "/v1/users/hb/tags", `{"tags":["has space"]}`)

	// MuteRoom: members may not send, the app still may.
	mr, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "g1", Muted: true})
	if err != nil || !mr.Muted {
		t.Fatalf("MuteRoom: %v %v", mr, err)
	}
	expectSendRefused(t, ga, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	mustHTTP(t, c, 200, "POST", "/v1/rooms/g1/mute", `{"muted":false}`)
	expectSendAccepted(t, ga, gb)

	// MuteMember: one user may not send.
	mm, err := g.MuteMember(ctx, &apipb.MuteMemberRequest{Room: "h1", Uid: "ha", DurationMs: 60_000})
	if err != nil || !mm.Muted || mm.MutedUntilMs == 0 {
		t.Fatalf("MuteMember: %v %v", mm, err)
	}
	expectSendRefused(t, ha, clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	expectSendAccepted(t, hb, ha)
	mustHTTP(t, c, 200, "POST", "/v1/rooms/h1/members/ha/mute", `{"lift":true}`)
	expectSendAccepted(t, ha, hb)

	// Kick.
	k, err := g.Kick(ctx, &apipb.KickRequest{Uid: "gb", Reason: "bye"})
	if err != nil || k.Kicked != 1 {
		t.Fatalf("Kick: %v %v", k, err)
	}
	gb.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)
	out = mustHTTP(t, c, 200, "POST", "/v1/users/hb/kick", `{"room":"h1"}`)
	if out["kicked"].(float64) != 1 {
		t.Fatalf("POST kick: %v", out)
	}
	hb.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_KICKED)

	// BanMember.
	b, err := g.BanMember(ctx, &apipb.BanMemberRequest{Room: "g1", Uid: "ga", Reason: "spam"})
	if err != nil || !b.Restriction.Banned || b.Kicked != 1 {
		t.Fatalf("BanMember: %v %v", b, err)
	}
	ga.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_BANNED)
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/h1/members/ha/ban", `{"duration_ms":60000}`)
	if out["restriction"].(map[string]any)["banned"] != true {
		t.Fatalf("POST ban: %v", out)
	}
	ha.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_BANNED)
	// Lifted, the user gets in again.
	if _, err := g.BanMember(ctx, &apipb.BanMemberRequest{Room: "g1", Uid: "ga", Lift: true}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		tok, _ := c.Mint("ga", "g1", nil, time.Hour)
		if f := testkit.DialTCP(t, n1).LoginAs(tok, "web"); f.GetLoginAck() == nil {
			return fmt.Errorf("ga after the ban was lifted: %v", f)
		}
		return nil
	})

	// CloseRoom: every member goes with ROOM_CLOSED, and logins are refused.
	gc, _ := member(t, n2, "gc", "g1")
	hc, _ := member(t, n1, "hc", "h1")
	cl, err := g.CloseRoom(ctx, &apipb.CloseRoomRequest{Room: "g1", Reason: "show is over"})
	if err != nil || cl.Room.Status != apipb.RoomStatus_ROOM_STATUS_CLOSED {
		t.Fatalf("CloseRoom: %v %v", cl, err)
	}
	gc.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED)
	out = mustHTTP(t, c, 200, "POST", "/v1/rooms/h1/close", ``)
	if out["room"].(map[string]any)["status"] != "ROOM_STATUS_CLOSED" {
		t.Fatalf("POST close: %v", out)
	}
	hc.ExpectKickAfterPushes(clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED)
	tok, _ := c.Mint("late", "h1", nil, time.Hour)
	expectRefused(t, testkit.DialTCP(t, n2), tok, clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED, "login to a closed room")
	if _, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "g1", Body: "anyone?"}); status.Code(err) != codes.NotFound {
		t.Fatalf("send to a closed room: %v, want NotFound", err)
	}
	// Updating a closed room conflicts; creating it again opens it.
	mustHTTP(t, c, 409, "PATCH", "/v1/rooms/h1", `{"name":"x"}`)
	mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"h1"}`)
}

var sendSeq atomic.Uint64

// answerTo returns the frame that answers the Send with seq, skipping pushes.
func answerTo(m *testkit.Client, seq uint64) *clientpb.Frame {
	for {
		f := m.Next()
		if f.GetPush() == nil {
			if f.GetSendAck().GetSeq() == seq || f.GetError().GetSeq() == seq || f.GetKick() != nil {
				return f
			}
		}
	}
}

// expectSendRefused checks that a send from m is refused with code. A mute reaches every room
// instance a moment after the API answered, so it tries for a while.
func expectSendRefused(t *testing.T, m *testkit.Client, code clientpb.ErrorCode) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		seq := sendSeq.Add(1)
		m.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: seq, Body: []byte("may I?")}}})
		if f := answerTo(m, seq); f.GetError().GetCode() != uint32(code) {
			return fmt.Errorf("want Error %v, got %v", code, f)
		}
		return nil
	})
}

// expectSendAccepted checks that a send from m is acknowledged and reaches other. A mute lifted
// reaches every room instance a moment later, so it tries for a while.
func expectSendAccepted(t *testing.T, m, other *testkit.Client) {
	t.Helper()
	var body string
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		seq := sendSeq.Add(1)
		body = fmt.Sprintf("hello %d", seq)
		m.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{Seq: seq, Body: []byte(body)}}})
		if f := answerTo(m, seq); f.GetSendAck() == nil {
			return fmt.Errorf("send answered with %v", f)
		}
		return nil
	})
	for {
		f := other.Next()
		if f.GetKick() != nil {
			t.Fatalf("want %q, got %v", body, f)
		}
		for _, m := range f.GetPush().GetMessages() { // pushes merge a tick's messages
			if string(m.Body) == body {
				return
			}
		}
	}
}

// grpcErrorCode returns the ErrorCode in a gRPC error's ErrorInfo.
func grpcErrorCode(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// TestAPIBadInputGRPC checks the defined answer to each kind of bad input over gRPC; the HTTP
// answers are in TestAPIBadInput and TestAPIBadInputRooms.
func TestAPIBadInputGRPC(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.API.Keys = auth.APIKeys{devcluster.APIKey: {App: devcluster.App}, "other-key": {App: "other"}}
	})
	g := grpcClient(t, c)
	ctx := devCtx()
	if _, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "mine"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"no key", func() error {
			_, err := g.GetRoom(context.Background(), &apipb.GetRoomRequest{Room: "mine"})
			return err
		}, codes.Unauthenticated, "UNAUTHORIZED"},
		{"wrong key", func() error { _, err := g.GetRoom(withKey("nope"), &apipb.GetRoomRequest{Room: "mine"}); return err }, codes.Unauthenticated, "UNAUTHORIZED"},
		{"another app's room", func() error {
			_, err := g.GetRoom(withKey("other-key"), &apipb.GetRoomRequest{Room: "mine"})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"close another app's room", func() error {
			_, err := g.CloseRoom(withKey("other-key"), &apipb.CloseRoomRequest{Room: "mine"})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"unknown room", func() error { _, err := g.GetRoom(ctx, &apipb.GetRoomRequest{Room: "nosuch"}); return err }, codes.NotFound, "ROOM_NOT_FOUND"},
		{"update unknown room", func() error { _, err := g.UpdateRoom(ctx, &apipb.UpdateRoomRequest{Room: "nosuch"}); return err }, codes.NotFound, "ROOM_NOT_FOUND"},
		{"mute unknown room", func() error {
			_, err := g.MuteRoom(ctx, &apipb.MuteRoomRequest{Room: "nosuch", Muted: true})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"ban in unknown room", func() error {
			_, err := g.BanMember(ctx, &apipb.BanMemberRequest{Room: "nosuch", Uid: "u"})
			return err
		}, codes.NotFound, "ROOM_NOT_FOUND"},
		{"kick unknown user", func() error { _, err := g.Kick(ctx, &apipb.KickRequest{Uid: "nobody"}); return err }, codes.NotFound, "USER_NOT_FOUND"},
		{"bad room name", func() error { _, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "a.b"}); return err }, codes.InvalidArgument, "BAD_REQUEST"},
		{"bad uid", func() error { _, err := g.GetUserSessions(ctx, &apipb.GetUserSessionsRequest{Uid: "a b"}); return err }, codes.InvalidArgument, "BAD_REQUEST"},
		{"bad settings", func() error {
			_, err := g.CreateRoom(ctx, &apipb.CreateRoomRequest{Room: "x", Settings: &roompb.RoomSettings{MaxMembers: -1}})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"bad page token", func() error {
			_, err := g.ListMembers(ctx, &apipb.ListMembersRequest{Room: "mine", PageToken: "!!"})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"negative duration", func() error {
			_, err := g.MuteMember(ctx, &apipb.MuteMemberRequest{Room: "mine", Uid: "u", DurationMs: -1})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"duration past ten years", func() error { // its end would overflow into the past
			_, err := g.BanMember(ctx, &apipb.BanMemberRequest{Room: "mine", Uid: "u", DurationMs: math.MaxInt64})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"no uids", func() error { _, err := g.SendToUsers(ctx, &apipb.SendToUsersRequest{Body: "x"}); return err }, codes.InvalidArgument, "BAD_REQUEST"},
		{"bad lane", func() error {
			_, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "mine", Body: "x", Lane: "fast"})
			return err
		}, codes.InvalidArgument, "BAD_REQUEST"},
		{"message too large", func() error {
			_, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "mine", Body: strings.Repeat("x", 16<<10+1)})
			return err
		}, codes.ResourceExhausted, "MESSAGE_TOO_LARGE"},
		{"request too large", func() error {
			_, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "mine", Body: strings.Repeat("x", 65<<10)})
			return err
		}, codes.ResourceExhausted, ""},
		{"tag expression", func() error {
			_, err := g.SendToRoom(ctx, &apipb.SendToRoomRequest{Room: "mine", Body: "x", TagExpr: `len(tags) > 0`})
			return err
		}, codes.InvalidArgument, "BAD_TAG_EXPR"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || grpcErrorCode(err) != tc.reason {
				t.Fatalf("got %v (reason %q), want %v with reason %q", err, grpcErrorCode(err), tc.code, tc.reason)
			}
		})
	}
	// The other app's key sees its own, empty, world.
	co, err := g.CountOnline(withKey("other-key"), &apipb.CountOnlineRequest{})
	if err != nil || co.Sessions != 0 {
		t.Fatalf("other app's count: %v %v", co, err)
	}
}

// TestAPIBadInputRooms checks the HTTP answers to bad input on the room calls.
func TestAPIBadInputRooms(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.API.Keys = auth.APIKeys{devcluster.APIKey: {App: devcluster.App}, "other-key": {App: "other"}}
	})
	mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"mine"}`)
	cases := []struct {
		name, method, path, key, body string
		status                        int
		code                          float64
	}{
		{"wrong key", "GET", "/v1/rooms/mine", "nope", "", 401, 106},
		{"another app's room", "GET", "/v1/rooms/mine", "other-key", "", 404, 105},
		{"another app bans in my room", "POST", "/v1/rooms/mine/members/u/ban", "other-key", "", 404, 105},
		{"unknown room", "GET", "/v1/rooms/nosuch/members", devcluster.APIKey, "", 404, 105},
		{"update unknown room", "PATCH", "/v1/rooms/nosuch", devcluster.APIKey, `{"name":"x"}`, 404, 105},
		{"kick unknown user", "POST", "/v1/users/nobody/kick", devcluster.APIKey, "", 404, 107},
		{"create without a room", "POST", "/v1/rooms", devcluster.APIKey, `{}`, 400, 100},
		{"unknown field", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","colour":"red"}`, 400, 100},
		{"unknown enum", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","settings":{"who_may_send":"EVERYONE"}}`, 400, 100},
		{"latency budget too long", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","settings":{"latency_budget_ms":5001}}`, 400, 100},
		{"gather too many", "PATCH", "/v1/rooms/mine", devcluster.APIKey, `{"settings":{"gather_messages":65}}`, 400, 100},
		{"moderator_expr not a tag expression", "PATCH", "/v1/rooms/mine", devcluster.APIKey, `{"settings":{"moderator_expr":"len(tags) > 0"}}`, 400, 104},
		{"moderator_room_expr not a tag expression", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","settings":{"moderator_room_expr":"role =="}}`, 400, 104},
		{"moderator_scope_prefix not a tag's start", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","settings":{"moderator_scope_prefix":"class 1"}}`, 400, 100},
		{"oversized body", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","name":"` + strings.Repeat("n", 65<<10) + `"}`, 413, 101},
		{"long name", "POST", "/v1/rooms", devcluster.APIKey, `{"room":"x","name":"` + strings.Repeat("n", 300) + `"}`, 400, 100},
		{"bad page size", "GET", "/v1/rooms/mine/members?page_size=5000", devcluster.APIKey, "", 400, 100},
		{"page size not a number", "GET", "/v1/rooms/mine/members?page_size=ten", devcluster.APIKey, "", 400, 100},
		{"unknown query parameter", "GET", "/v1/rooms/mine/members?colour=red", devcluster.APIKey, "", 400, 100},
		{"too many uids", "POST", "/v1/users/messages", devcluster.APIKey, `{"body":"x","uids":[` + strings.Repeat(`"u",`, 100) + `"u"]}`, 400, 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out := httpCall(t, c, tc.method, tc.path, tc.key, tc.body)
			if status != tc.status || out["code"] != tc.code || out["error"] == "" {
				t.Fatalf("HTTP %d %v, want %d with code %v", status, out, tc.status, tc.code)
			}
		})
	}
}

// TestBanRacesLogin bans a user while it logs in again and again on both nodes: once the ban call
// has answered, no session of the user is left, and every later login is refused.
func TestBanRacesLogin(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.ServiceInstances = 2, 2 })
	mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"arena"}`)
	tok, _ := c.Mint("racer", "arena", nil, time.Hour)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var clients []*testkit.Client
	for _, node := range c.Nodes {
		addr := node.TCPAddr()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cl := testkit.DialTCP(t, addr)
				cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: tok, Device: "web"}}})
				mu.Lock()
				clients = append(clients, cl)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // the scenario: a steady stream of logins
			}
		}()
	}
	// Let a stream of logins be in flight when the ban comes.
	testkit.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(clients) < 20 {
			return fmt.Errorf("%d logins sent", len(clients))
		}
		return nil
	})
	mustHTTP(t, c, 200, "POST", "/v1/rooms/arena/members/racer/ban", `{"reason":"cheating"}`)
	close(stop)
	wg.Wait()

	// Every connection opened ends: logins before the ban are kicked, those in flight refused.
	mu.Lock()
	all := clients
	mu.Unlock()
	for _, cl := range all {
		select {
		case <-cl.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection of the banned user is still open (%d tried)", len(all))
		}
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		out := mustHTTP(t, c, 200, "GET", "/v1/users/racer/sessions", "")
		if out["online"] != false {
			return fmt.Errorf("banned user still has sessions: %v", out)
		}
		return nil
	})
	for _, node := range c.Nodes {
		expectRefused(t, testkit.DialTCP(t, node.TCPAddr()), tok, clientpb.CloseCode_CLOSE_CODE_BANNED, "login after the ban")
	}
	t.Logf("%d logins raced the ban", len(all))
}

// TestSettingsBeforeFirstJoin changes a room's settings and at once sends the join of the
// room's first member on a node, as a ChatLink does: the answer carries the new settings even
// when the room service's cache has not caught up yet (it reads the store for a first join).
func TestSettingsBeforeFirstJoin(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.ServiceInstances = 2 })
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := range 100 {
		room := fmt.Sprintf("fresh-%d", i)
		mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"`+room+`"}`)
		tick := 100 + i
		mustHTTP(t, c, 200, "PATCH", "/v1/rooms/"+room, fmt.Sprintf(`{"settings":{"flush_tick_ms":%d}}`, tick))
		var rep buspb.Reply
		err := bus.Request(context.Background(), nc, bus.SubjectRoomJoin, &buspb.JoinRequest{
			App: devcluster.App, Room: room, Uid: "u", Node: "n", SessionId: "s", FirstOnNode: true,
		}, &rep)
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.GetSettings().GetFlushTickMs(); got != uint32(tick) {
			t.Fatalf("join %d right after the change: flush tick %d, want %d", i, got, tick)
		}
	}
}

// TestNodeErrorReachesTheCaller: a node that answers a member listing with an error code makes
// the listing fail with that code, rather than count as a node with no members.
func TestNodeErrorReachesTheCaller(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A node "ghost" that reports a member in room n1 and refuses every control request.
	sub, err := nc.Subscribe(bus.NodeSubject("ghost"), func(m *nats.Msg) {
		b, _ := proto.Marshal(&buspb.NodeControlReply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "ghost is busy"})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	report, _ := proto.Marshal(&buspb.NodeReport{Node: "ghost", Boot: "b1", Seq: 1, TimeMs: time.Now().UnixMilli(), Sessions: 1,
		Rooms: []*buspb.RoomCount{{App: devcluster.App, Room: "n1", Members: 1}}, Last: true})
	g := grpcClient(t, c)
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if err := nc.Publish(bus.SubjectSessionsReport, report); err != nil {
			return err
		}
		gr, err := g.GetRoom(devCtx(), &apipb.GetRoomRequest{Room: "n1"})
		if err != nil || gr.Nodes["ghost"] != 1 {
			return fmt.Errorf("GetRoom: %v %v", gr, err)
		}
		return nil
	})
	_, err = g.ListMembers(devCtx(), &apipb.ListMembersRequest{Room: "n1"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "ghost is busy") {
		t.Fatalf("ListMembers with a node that refuses: %v, want Unavailable: ghost is busy", err)
	}
}
