package room

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/callback"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/tag"
)

// The app's backend is called from the NATS handlers, but not waited for there: the callback
// client answers on a goroutine of the app's own bounded pool, and the decision's function
// answers the request. A slow backend holds its app's pool only, never the handler that admits
// every app's logins and sends. The room service's own refusals come first, so an app is never
// asked about a banned member or a closed room.

// loginCallback hands an admitted login to its app's login hook, when the app has one, and
// answers the join when the hook decided. It reports whether it did.
func (s *Service) loginCallback(msg *nats.Msg, start time.Time, req *buspb.JoinRequest, meta *apipb.Room) bool {
	return s.cfg.Callbacks.Login(req.App, callback.LoginRequest{
		App: req.App, Room: req.Room, UID: req.Uid, SessionID: req.SessionId, Node: req.Node, Device: req.Device, Tags: req.Tags,
	}, func(d callback.Decision) {
		switch {
		case !d.Allow && d.Failure != "":
			s.respond(msg, opJoin, start, refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "the app's login check did not answer ("+d.Failure+")"))
		case !d.Allow:
			s.respond(msg, opJoin, start, refuse(clientpb.ErrorCode_ERROR_CODE_DENIED_BY_APP, clientpb.CloseCode_CLOSE_CODE_DENIED_BY_APP, denyReason(d, "login denied by the app")))
		case d.Tags != nil:
			s.answerJoin(msg, start, req, meta, &roompb.MemberTags{Uid: req.Uid, Tags: tag.Canonical(*d.Tags)})
		default:
			s.answerJoin(msg, start, req, meta, nil)
		}
	})
}

// sendCallback hands a member's send to its app's send hook and answers the send (answer, once)
// when the hook decided. checked is req as the room's checks left it (memberSend): the app is
// asked about the lane the message would go on, and may lower it. The server API's sends are
// never called back: they come from the app's own server.
func (s *Service) sendCallback(req, checked *buspb.SendRequest, answer func(*buspb.Reply)) {
	lane := checked.Lane
	if lane == clientpb.Lane_LANE_UNSPECIFIED {
		lane = clientpb.Lane_LANE_NORMAL
	}
	called := s.cfg.Callbacks.Send(req.App, callback.SendRequest{
		App: req.App, Room: req.Room, UID: req.Uid, SessionID: req.SessionId,
		Type: req.Type, Lane: int32(lane), Body: req.Body, TagExpr: req.TagExpr, SenderTags: req.SenderTags,
	}, func(d callback.Decision) {
		switch {
		case !d.Allow && d.Failure != "":
			answer(refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the app's send check did not answer ("+d.Failure+")"))
			return
		case !d.Allow:
			answer(refuse(clientpb.ErrorCode_ERROR_CODE_DENIED_BY_APP, 0, denyReason(d, "message denied by the app")))
			return
		}
		if d.Body != nil {
			req.Body = d.Body
		}
		if d.Type != nil {
			req.Type = *d.Type
		}
		// From the lane the room's checks left, so that they do not lower it twice; the
		// callback package takes no raise.
		req.Lane = lane
		if d.Lane != nil && clientpb.Lane(*d.Lane) > lane {
			req.Lane = clientpb.Lane(*d.Lane)
			s.metrics.demoted.Inc()
		}
		s.sendThen(context.Background(), []*buspb.SendRequest{req}, answer)
	})
	if !called { // the hook is gone: configured hooks do not change, but do not leave it hanging
		s.sendThen(context.Background(), []*buspb.SendRequest{req}, answer)
	}
}

// maxReasonBytes bounds the app's reason a client is told.
const maxReasonBytes = 200

// denyReason is the app's reason for a deny, or def without one.
func denyReason(d callback.Decision, def string) string {
	r := d.Reason
	if r == "" {
		return def
	}
	if len(r) > maxReasonBytes {
		r = strings.ToValidUTF8(r[:maxReasonBytes], "")
	}
	return r
}
