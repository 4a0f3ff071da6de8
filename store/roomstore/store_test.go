package roomstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// TestStore creates, updates and restricts a room, and stores a member's tags: what the server
// API does through the store and the room service follows.
func TestStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc := testkit.Connect(t, testkit.NATS(t))
	s, err := OpenStore(ctx, nc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r, rev, err := s.Room(ctx, "a", "r"); r != nil || rev != 0 || err != nil {
		t.Fatalf("a room never created: %v, %d, %v", r, rev, err)
	}
	if _, err := s.UpdateRoom(ctx, "a", "r", func(*apipb.Room) error { return nil }); !errors.Is(err, ErrRoomNotFound) {
		t.Fatalf("update of a room never created: %v", err)
	}
	for i, want := range []bool{true, false} {
		if created, err := s.CreateRoom(ctx, "a", &apipb.Room{Room: "r", Name: "first"}); created != want || err != nil {
			t.Fatalf("create %d: %v, %v; want %v", i, created, err, want)
		}
	}
	if _, err := s.UpdateRoom(ctx, "a", "r", func(r *apipb.Room) error { r.Name = "second"; return nil }); err != nil {
		t.Fatal(err)
	}
	if r, _, err := s.Room(ctx, "a", "r"); err != nil || r.GetName() != "second" {
		t.Fatalf("after the update: %v, %v", r, err)
	}
	r, err := s.UpdateRestriction(ctx, "a", "r", "u", func(r *apipb.MemberRestriction) { r.Muted = true })
	if err != nil || !r.Muted || r.Room != "r" || r.Uid != "u" {
		t.Fatalf("restriction: %v, %v", r, err)
	}
	if err := s.PutMemberTags(ctx, "a", &roompb.MemberTags{Uid: "u", Tags: []string{"vip"}}); err != nil {
		t.Fatal(err)
	}
	if tags, err := s.MemberTags(ctx, "a", "u"); err != nil || len(tags.GetTags()) != 1 {
		t.Fatalf("tags: %v, %v", tags, err)
	}
	var names []string
	for _, kv := range s.Buckets() {
		names = append(names, kv.Bucket())
	}
	if want := []string{BucketRooms, BucketRestrictions, BucketMemberTags}; !slices.Equal(names, want) {
		t.Errorf("buckets %v, want %v", names, want)
	}
	if _, err := s.Buckets()[0].Get(ctx, RoomKey("a", "r")); err != nil {
		t.Errorf("%s has no %s: %v", BucketRooms, RoomKey("a", "r"), err)
	}
}

// TestCheckSend refuses what a room does not accept from a sender.
func TestCheckSend(t *testing.T) {
	t.Parallel()
	ok := func() *buspb.SendRequest { return &buspb.SendRequest{App: "a", Room: "r", Body: []byte("hi")} }
	for name, c := range map[string]struct {
		change func(*buspb.SendRequest)
		code   clientpb.ErrorCode // 0: accepted
	}{
		"accepted":      {func(*buspb.SendRequest) {}, 0},
		"no room":       {func(r *buspb.SendRequest) { r.Room = "" }, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST},
		"empty body":    {func(r *buspb.SendRequest) { r.Body = nil }, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST},
		"large body":    {func(r *buspb.SendRequest) { r.Body = make([]byte, MaxBodyBytes+1) }, clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE},
		"long type":     {func(r *buspb.SendRequest) { r.Type = strings.Repeat("t", MaxTypeBytes+1) }, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST},
		"unknown lane":  {func(r *buspb.SendRequest) { r.Lane = clientpb.Lane_LANE_BULK + 1 }, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST},
		"any tag expr":  {func(r *buspb.SendRequest) { r.TagExpr = "((" }, 0}, // the room service compiles it
		"largest body":  {func(r *buspb.SendRequest) { r.Body = make([]byte, MaxBodyBytes) }, 0},
		"invalid UTF-8": {func(r *buspb.SendRequest) { r.Type = "\xff" }, clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST},
	} {
		req := ok()
		c.change(req)
		rep := CheckSend(req)
		if got := clientpb.ErrorCode(rep.GetCode()); got != c.code {
			t.Errorf("%s: %v (%s), want %v", name, got, rep.GetMessage(), c.code)
		}
	}
}
