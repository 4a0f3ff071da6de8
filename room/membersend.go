package room

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/callback"
	"roomcast/internal/buspb"
	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// A member's send is held to more than the app server's. Its lane is the member's to name but
// not always to have: a critical message is never thinned by budgets or flow control and
// reaches every member of the room, so one script naming the critical lane would hold it for a
// room of any size. Only the app server, the members the room's critical_expr allows and those
// whose token grants the lane (auth.LaneCritical) send critical messages; another member's is
// refused with 123 (LANE_NOT_ALLOWED), or sent on the normal lane when the room says so
// (demote_critical). And a room's members together send at most so many messages a second, and
// so many critical ones, whatever the room's size and however many nodes they are spread over.

// Defaults of the room-wide caps on members' sends (Config.MemberSendsPerSecond,
// MemberCriticalPerSecond; docs/edge.md says why these sizes).
const (
	// DefaultMemberSendsPerSecond is fifty times what a member reads of the normal and bulk
	// lanes (20 a second): the edge's budgets still choose among them, and no room's members
	// carry more than this to every node of the room.
	DefaultMemberSendsPerSecond = 1000
	// DefaultMemberCriticalPerSecond is a member's critical budget (10 a second): the critical
	// lane is never thinned, so the members allowed on it together fill at most what each
	// member is meant to read, leaving the app server's own critical messages their place.
	DefaultMemberCriticalPerSecond = 10
)

// memberRates are the rooms' token buckets of members' sends, per instance.
type memberRates struct {
	sends, critical *ratelimit.Table[roomKey]
}

// memberRatesSize bounds the rooms each table remembers; the least active are forgotten first
// (a forgotten room starts again with a full bucket).
const memberRatesSize = 1 << 16

func newMemberRates() memberRates {
	return memberRates{sends: ratelimit.NewTable[roomKey](memberRatesSize), critical: ratelimit.NewTable[roomKey](memberRatesSize)}
}

// perSecond is a cap of n a second with bursts of 2n; n <= 0 is no cap.
func perSecond(n int) ratelimit.Limit {
	if n <= 0 {
		return ratelimit.Limit{}
	}
	return ratelimit.Limit{Rate: float64(n), Burst: 2 * n}
}

// memberSend takes a member's send: the room's checks, the room's caps on its members' sends,
// then the app's send callback if it has one, and the broadcast.
func (s *Service) memberSend(ctx context.Context, msg *nats.Msg, start time.Time, req *buspb.SendRequest) {
	now := s.cfg.Now()
	hook := s.cfg.Callbacks.Has(req.App, callback.HookSend)
	checked := req
	if hook {
		// On a copy: the checks narrow its audience and may lower its lane, and the send after
		// the app's decision checks the original again.
		checked = proto.CloneOf(req)
	}
	rep := s.check(checked, now)
	if rep == nil {
		rep = s.takeMemberRates(checked, now)
	}
	switch {
	case rep != nil:
		s.respond(msg, opSend, start, rep)
	case hook:
		s.sendCallback(msg, start, req, checked) // the app's backend decides, and callbacks.go answers
	default:
		rep, w := s.accept(ctx, []*buspb.SendRequest{req}, now)
		s.respondSent(msg, start, rep, w)
	}
}

// checkLane holds a member's message to the lanes it may use: a critical one needs the room's
// critical_expr or the member's token (critical_granted); otherwise it is refused, or goes on
// the normal lane when the room demotes. Caller has checked that req is a member's.
func (s *Service) checkLane(req *buspb.SendRequest, st *roompb.RoomSettings) *buspb.Reply {
	if req.Lane != clientpb.Lane_LANE_CRITICAL || req.CriticalGranted {
		return nil
	}
	if src := st.GetCriticalExpr(); src != "" {
		if e, err := s.exprs.Get(src); err == nil && e.EvalTags(req.SenderTags, req.Uid) {
			return nil
		}
	}
	if st.GetDemoteCritical() {
		req.Lane = clientpb.Lane_LANE_NORMAL
		s.metrics.demoted.Inc()
		return nil
	}
	return refuse(clientpb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED, 0, "only the app and the members it allows send critical messages in this room")
}

// takeMemberRates takes a checked member's message from its room's caps, or refuses it with
// 120 and the time until the cap has room.
func (s *Service) takeMemberRates(req *buspb.SendRequest, now time.Time) *buspb.Reply {
	k := roomKey{req.App, req.Room}
	// The room-wide cap first: a send it refuses then takes nothing of the scarcer critical cap.
	if ok, retry := s.members.sends.Take(k, perSecond(s.cfg.MemberSendsPerSecond), now); !ok {
		return rateLimited("the room's member_sends rate", retry)
	}
	if req.Lane == clientpb.Lane_LANE_CRITICAL {
		n := int(s.cache.room(req.App, req.Room).GetSettings().GetMemberCriticalPerSecond())
		if n == 0 {
			n = s.cfg.MemberCriticalPerSecond
		}
		if ok, retry := s.members.critical.Take(k, perSecond(n), now); !ok {
			return rateLimited("the room's member_critical rate", retry)
		}
	}
	return nil
}

// rateLimited refuses a send over a cap, with when to send it again.
func rateLimited(limit string, retry time.Duration) *buspb.Reply {
	return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED), Message: "over " + limit, RetryAfterMs: ratelimit.Millis(retry)}
}
