package room_test

import (
	"net/http"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	pb "roomcast/proto/roomcastpb"
)

// mint returns a token of the dev app for uid in room, with tags and mint options.
func mint(t testing.TB, uid, room string, tags []string, opts ...auth.MintOption) string {
	t.Helper()
	tok, err := auth.Mint([]byte(devcluster.Secret), devcluster.App, uid, room, tags, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func sendOn(seq uint64, lane pb.Lane, body string) *pb.Frame {
	return &pb.Frame{Kind: &pb.Frame_Send{Send: &pb.Send{Seq: seq, Type: "chat", Lane: lane, Body: []byte(body)}}}
}

// TestMemberCriticalLane: by default a member's critical send is refused with 123
// (LANE_NOT_ALLOWED) and reaches nobody, while the app server's, and those of members the
// room's critical_expr or their token allow, go out on the critical lane; a room with
// demote_critical sends the others' on the normal lane instead.
func TestMemberCriticalLane(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	for _, body := range []string{
		`{"room":"hosts","settings":{"critical_expr":"\"host\" in tags"}}`,
		`{"room":"demote","settings":{"demote_critical":true}}`,
	} {
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey, body, nil); code != http.StatusCreated {
			t.Fatalf("create room %s: HTTP %d", body, code)
		}
	}
	ws := c.Nodes[0].WSURL()
	dial := func(tok string) *testkit.Client {
		cl := testkit.DialWS(t, ws)
		cl.Login(tok)
		return cl
	}
	// expect reads the next message a viewer receives and checks its body and lane.
	expect := func(t *testing.T, viewer *testkit.Client, body string, lane pb.Lane) {
		t.Helper()
		msgs, _ := viewer.CollectPushes(1)
		if len(msgs) != 1 || string(msgs[0].Body) != body || msgs[0].Lane != lane {
			t.Fatalf("viewer got %v, want only %q on %v", msgs, body, lane)
		}
	}
	// answer is the next frame of a sender that is not a Push (of others' messages).
	answer := func(cl *testkit.Client) *pb.Frame {
		f := cl.Next()
		for f.GetPush() != nil {
			f = cl.Next()
		}
		return f
	}
	acked := func(t *testing.T, cl *testkit.Client, seq uint64) {
		t.Helper()
		if f := answer(cl); f.GetSendAck() == nil || f.GetSendAck().Seq != seq {
			t.Fatalf("want SendAck %d, got %v", seq, f)
		}
	}

	t.Run("by default", func(t *testing.T) {
		viewer := dial(mint(t, "viewer", "plain", nil))
		member := dial(mint(t, "member", "plain", []string{"host"}))
		granted := dial(mint(t, "granted", "plain", nil, auth.WithLanes(auth.LaneCritical)))

		member.Send(sendOn(1, pb.Lane_LANE_CRITICAL, "from a member"))
		e := answer(member).GetError()
		if e == nil || e.Seq != 1 || e.Code != uint32(pb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED) {
			t.Fatalf("a member's critical send: want Error 123, got %v", e)
		}
		member.Send(sendOn(2, pb.Lane_LANE_NORMAL, "a member's chat"))
		acked(t, member, 2)
		expect(t, viewer, "a member's chat", pb.Lane_LANE_NORMAL) // and not the critical one before it

		granted.Send(sendOn(1, pb.Lane_LANE_CRITICAL, "granted by the token"))
		acked(t, granted, 1)
		expect(t, viewer, "granted by the token", pb.Lane_LANE_CRITICAL)

		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/plain/messages", devcluster.APIKey, `{"body":"from the app","lane":"critical"}`, nil); code != http.StatusOK {
			t.Fatalf("the app's critical send: HTTP %d", code)
		}
		expect(t, viewer, "from the app", pb.Lane_LANE_CRITICAL)
	})

	t.Run("critical_expr", func(t *testing.T) {
		viewer := dial(mint(t, "viewer", "hosts", nil))
		host := dial(mint(t, "host", "hosts", []string{"host"}))
		guest := dial(mint(t, "guest", "hosts", []string{"guest"}))

		guest.Send(sendOn(1, pb.Lane_LANE_CRITICAL, "from a guest"))
		if e := answer(guest).GetError(); e == nil || e.Code != uint32(pb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED) {
			t.Fatalf("a guest's critical send: want Error 123, got %v", e)
		}
		host.Send(sendOn(1, pb.Lane_LANE_CRITICAL, "from the host"))
		acked(t, host, 1)
		expect(t, viewer, "from the host", pb.Lane_LANE_CRITICAL)
	})

	t.Run("demote_critical", func(t *testing.T) {
		viewer := dial(mint(t, "viewer", "demote", nil))
		member := dial(mint(t, "member", "demote", nil))
		member.Send(sendOn(1, pb.Lane_LANE_CRITICAL, "demoted"))
		acked(t, member, 1)
		expect(t, viewer, "demoted", pb.Lane_LANE_NORMAL)
	})
}
