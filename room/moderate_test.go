package room

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// TestModerateRefusals: the room service refuses a moderate request that is malformed (a recall's
// too), a recall of a message the room's history does not hold, one that comes from a member
// who moderates nothing, from a scoped moderator without a tag of the scope, or about a member
// with no session in the room, or in a closed room, each with its code and a message saying
// why, and changes nothing.
func TestModerateRefusals(t *testing.T) {
	t.Parallel()
	s, _, nc := startService(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	settings := &roompb.RoomSettings{ModeratorExpr: `role == "assistant"`, ModeratorScopePrefix: "class:", ModeratorRoomExpr: `role == "lecturer"`}
	for _, room := range []string{"open", "shut"} {
		if _, err := s.store.CreateRoom(ctx, "a", &apipb.Room{Room: room, Settings: settings}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.store.UpdateRoom(ctx, "a", "shut", func(r *apipb.Room) error {
		r.Status = apipb.RoomStatus_ROOM_STATUS_CLOSED
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if s.cache.room("a", "shut").GetStatus() != apipb.RoomStatus_ROOM_STATUS_CLOSED || s.cache.room("a", "open") == nil {
			return context.DeadlineExceeded
		}
		return nil
	})

	assistant := []string{"role:assistant", "class:1"}
	req := func(room string, tags []string, r *clientpb.ModerateRequest) *buspb.ModerateBusRequest {
		return &buspb.ModerateBusRequest{App: "a", Room: room, Uid: "mod", SessionId: "s-mod", Tags: tags, Request: r}
	}
	mute := func(uid string) *clientpb.ModerateRequest {
		return &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: uid}
	}
	const msgID = "01ARZ3NDEKTSV4RRFFQ69G5FAV" // a message id of 2016
	for _, tc := range []struct {
		name string
		req  *buspb.ModerateBusRequest
		code clientpb.ErrorCode
		says string
	}{
		{"no request", req("open", assistant, nil), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "without its request"},
		{"no op", req("open", assistant, &clientpb.ModerateRequest{Uid: "x"}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown op"},
		{"unknown op", req("open", assistant, &clientpb.ModerateRequest{Op: 9, Uid: "x"}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown op 9"},
		{"no uid", req("open", assistant, mute("")), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "uid"},
		{"a uid with a space", req("open", assistant, mute("a b")), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "uid"},
		{"themselves", req("open", assistant, mute("mod")), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "themselves"},
		{"negative duration", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "x", DurationMs: -1}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "negative"},
		{"duration past a year", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "x", DurationMs: 1 << 62}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a year"},
		{"duration with remove", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_REMOVE, Uid: "x", DurationMs: 5}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "duration_ms is for mute"},
		{"reason with mute", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "x", Reason: "r"}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason is for remove"},
		{"long reason", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_REMOVE, Uid: "x", Reason: strings.Repeat("r", 257)}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "256 bytes"},
		{"recall with a uid", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_RECALL, Uid: "x", MessageId: msgID}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "uid must be empty"},
		{"recall without a message id", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_RECALL}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "not a message id"},
		{"recall of a malformed id", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_RECALL, MessageId: "01ARZ3NDEKTSV4RRFFQ69G5FA"}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "not a message id"},
		{"message id with mute", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "x", MessageId: msgID}), clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "message_id is for recall"},
		{"recall of a message the room never had", req("open", assistant, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_RECALL, MessageId: msgID}), clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND, "holds no such message"},
		{"closed room", req("shut", assistant, mute("x")), clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, "closed"},
		{"a member who moderates nothing", req("open", []string{"class:1"}, mute("x")), clientpb.ErrorCode_ERROR_CODE_NOT_MODERATOR, "not a moderator"},
		{"a room without moderators", req("nowhere", assistant, mute("x")), clientpb.ErrorCode_ERROR_CODE_NOT_MODERATOR, "not a moderator"},
		// No presence service runs here: a lookup of the target finds no one to answer.
		{"the target cannot be looked up", req("open", assistant, mute("x")), clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, "presence"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rep buspb.Reply
			if err := bus.Request(ctx, nc, bus.SubjectRoomModerate, tc.req, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Code != uint32(tc.code) || !strings.Contains(rep.Message, tc.says) {
				t.Errorf("answer %d %q, want %d (%v) saying %q", rep.Code, rep.Message, tc.code, tc.code, tc.says)
			}
		})
	}
	// A scoped moderator without a tag of the scope is refused before the target is looked up.
	var rep buspb.Reply
	if err := bus.Request(ctx, nc, bus.SubjectRoomModerate, req("open", []string{"role:assistant"}, mute("x")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE) || !strings.Contains(rep.Message, "no class: tag") {
		t.Errorf("a scoped moderator without a class: tag: %v, want OUTSIDE_SCOPE", &rep)
	}
	// A payload that does not parse.
	msg, err := nc.RequestWithContext(ctx, bus.SubjectRoomModerate, []byte{0xff, 0xff})
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(msg.Data, &rep); err != nil || rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST) {
		t.Errorf("a payload that does not parse: %v, %v; want BAD_REQUEST", &rep, err)
	}
	// Nothing was written: no restriction for x.
	if r := s.cache.restriction("a", "open", "x"); r != nil {
		t.Errorf("refused requests left a restriction: %v", r)
	}
}
