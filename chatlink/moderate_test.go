package chatlink_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// pestWithTrail starts a cluster whose audit trail it returns, and logs a member in.
func pestWithTrail(t *testing.T) (*testkit.Buffer, *testkit.Client) {
	t.Helper()
	var trail testkit.Buffer
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.Audit = slog.New(slog.NewJSONHandler(&trail, nil))
	})
	cl := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	if ack := cl.Login(testcluster.Token(t, "pest", "quiet")); ack == nil {
		t.Fatal("no login ack")
	}
	return &trail, cl
}

// TestModerateRate: a connection's moderate requests are answered in order, each with its seq;
// past the connection's rate (bursts of 10) they are refused at the edge with 120 and the
// limit's name, without reaching the room service and without an audit record each, while the
// ones under it are judged (here: no moderator, 140) and audited.
func TestModerateRate(t *testing.T) {
	t.Parallel()
	trail, cl := pestWithTrail(t)
	const n = 20
	for i := range n {
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: &clientpb.ModerateRequest{
			Seq: uint64(i + 1), Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: "victim",
		}}})
	}
	judged, limited := 0, 0
	for i := range n {
		f := cl.NextWithin(10 * time.Second)
		rep := f.GetModerateReply()
		switch {
		case rep == nil:
			t.Fatalf("reply %d: %v, want a ModerateReply", i+1, f)
		case rep.Seq != uint64(i+1):
			t.Fatalf("reply %d answers seq %d", i+1, rep.Seq)
		case rep.Code == uint32(clientpb.ErrorCode_ERROR_CODE_NOT_MODERATOR):
			judged++
		case rep.Code == uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) && strings.Contains(rep.Message, "moderate_conn"):
			limited++
		default:
			t.Fatalf("reply %d: %v", i+1, rep)
		}
	}
	if judged < 10 || limited == 0 {
		t.Errorf("%d judged, %d over the rate; want the burst of 10 judged and some over the rate", judged, limited)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := strings.Count(trail.String(), `"msg":"moderator action"`); got != judged {
			return fmt.Errorf("%d audit records, want one per judged request, %d", got, judged)
		}
		return nil
	})
}

// TestSetAttributeRate: a connection's SetAttributes are answered in order, each with its seq;
// past the connection's rate (bursts of 10) they are refused at the edge with 120, the limit's
// name and a retry hint, without reaching the room service and without an audit record each,
// while the ones under it are judged (here: the room permits no member, 150) and audited.
func TestSetAttributeRate(t *testing.T) {
	t.Parallel()
	trail, cl := pestWithTrail(t)
	const n = 20
	for i := range n {
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_SetAttribute{SetAttribute: &clientpb.SetAttribute{
			Seq: uint64(i + 1), Key: "pinned", Value: fmt.Sprint("spam ", i),
		}}})
	}
	judged, limited := 0, 0
	for i := 0; i < n; {
		f := cl.NextWithin(10 * time.Second)
		rep := f.GetSetAttributeReply()
		switch {
		case f.GetRoomAttributes() != nil || f.GetViewerCount() != nil || f.GetMemberNotice() != nil:
			continue // the room's live state, not an answer
		case rep == nil:
			t.Fatalf("reply %d: %v, want a SetAttributeReply", i+1, f)
		case rep.Seq != uint64(i+1):
			t.Fatalf("reply %d answers seq %d", i+1, rep.Seq)
		case rep.Code == uint32(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED):
			judged++
		case rep.Code == uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) && strings.Contains(rep.Message, "attribute_conn") && rep.RetryAfterMs > 0:
			limited++
		default:
			t.Fatalf("reply %d: %v", i+1, rep)
		}
		i++
	}
	if judged < 10 || limited == 0 {
		t.Errorf("%d judged, %d over the rate; want the burst of 10 judged and some over the rate", judged, limited)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := strings.Count(trail.String(), `"method":"SetAttribute"`); got != judged {
			return fmt.Errorf("%d audit records, want one per judged change, %d", got, judged)
		}
		return nil
	})
}
