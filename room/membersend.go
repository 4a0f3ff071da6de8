package room

import (
	"context"
	"sync"
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
	attrs           *ratelimit.Table[roomKey] // members' attribute changes (attributes.go)
}

// memberRatesSize bounds the rooms each table remembers; the least active are forgotten first
// (a forgotten room starts again with a full bucket).
const memberRatesSize = 1 << 16

func newMemberRates() memberRates {
	return memberRates{sends: ratelimit.NewTable[roomKey](memberRatesSize), critical: ratelimit.NewTable[roomKey](memberRatesSize),
		attrs: ratelimit.NewTable[roomKey](memberRatesSize)}
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
		// The app's backend decides, and callbacks.go answers.
		s.sendCallback(req, checked, func(rep *buspb.Reply) { s.respond(msg, opSend, start, rep) })
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

// memberBatch takes the sends a ChatLink's members made to one room over a window
// (SendBatchRequest.members): each is checked, held to the room's caps and, for an app with a
// send callback, called back on its own, as memberSend would; the admitted ones without a
// callback are stamped and handed to the broadcast together. The reply carries one answer per
// send, in order, and goes once every send has its answer: for a batch holding a critical
// message, once its window is published; for one with callbacks, once the app decided on each.
func (s *Service) memberBatch(ctx context.Context, msg *nats.Msg, start time.Time, reqs []*buspb.SendRequest) {
	now := s.cfg.Now()
	answers := make([]*buspb.Reply, len(reqs))
	hook := s.cfg.Callbacks.Has(reqs[0].App, callback.HookSend)
	var admitted []*buspb.SendRequest
	var at []int // admitted[k] answers answers[at[k]]
	var called []int
	var calledChecked []*buspb.SendRequest // as the checks left called[k]
	for i, req := range reqs {
		if req.SessionId == "" {
			answers[i] = refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "a members' batch holds members' sends")
			continue
		}
		checked := req
		if hook {
			checked = proto.CloneOf(req)
		}
		rep := s.check(checked, now)
		if rep == nil {
			rep = s.takeMemberRates(checked, now)
		}
		switch {
		case rep != nil:
			answers[i] = rep
		case hook:
			called, calledChecked = append(called, i), append(calledChecked, checked)
		default:
			admitted, at = append(admitted, req), append(at, i)
		}
	}
	// left counts the answers still to come: the admitted ones' (one, for all of them) and each
	// callback's. The last to arrive answers the request.
	var mu sync.Mutex
	left := len(called)
	if len(admitted) > 0 {
		left++
	}
	finish := func() {
		mu.Lock()
		left--
		last := left == 0
		mu.Unlock()
		if last {
			s.respond(msg, opSend, start, &buspb.Reply{Answers: answers})
		}
	}
	if left == 0 {
		s.respond(msg, opSend, start, &buspb.Reply{Answers: answers})
		return
	}
	for k, i := range called {
		s.sendCallback(reqs[i], calledChecked[k], func(rep *buspb.Reply) {
			answers[i] = rep // each callback writes its own slot; finish orders them before the reply
			finish()
		})
	}
	if len(admitted) > 0 {
		s.acceptThen(ctx, admitted, now, func(rep *buspb.Reply) {
			for k, i := range at {
				if rep.GetCode() != 0 {
					answers[i] = rep
					continue
				}
				answers[i] = &buspb.Reply{MessageId: rep.MessageIds[k], ServerTimeMs: rep.ServerTimeMs}
			}
			finish()
		})
	}
}
