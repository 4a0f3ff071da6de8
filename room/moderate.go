package room

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/roomstore"
)

// Moderators in the room: a member whose tags satisfy the room's moderator_expr mutes, unmutes
// and removes the members of its scope, and recalls their messages, from its client (a
// ModerateRequest, passed on by its ChatLink with the member's uid and tags); one whose tags
// satisfy moderator_room_expr does so for every member. The scope is the members sharing one of
// the moderator's tags that start with moderator_scope_prefix ("class:": an assistant tagged
// class:3 acts on class:3), or every member when the prefix is empty; a scoped moderator never
// acts on a room-wide one. The effect is the server API's: a mute is the same restriction record
// (roomstore.Mute), which every instance's cache then applies to the member's sends; a removal
// is the same kick of the member's sessions in the room by their nodes; a recall is Recall's,
// naming the moderator. The moderator's ChatLink writes the audit record of each request with
// its answer.

// moderateTimeout bounds the lookups and writes of one moderate request: under the ChatLinks'
// request timeout (3 s by default), so the member hears this service's answer, not a timeout.
const moderateTimeout = 2 * time.Second

// maxModerateReason bounds the reason a removal tells the member (the server API's bound).
const maxModerateReason = 256

// maxMuteMs bounds a timed mute (a year); longer ones are mutes until unmuted (0). It keeps the
// mute's end from overflowing into the past, which would lift it at once.
const maxMuteMs = 365 * 24 * 60 * 60 * 1000

// removedReason is what a removed member is told when the moderator gave no reason.
const removedReason = "removed by a moderator"

func (s *Service) onModerate(msg *nats.Msg) {
	start := time.Now()
	var req buspb.ModerateBusRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opModerate, start, rep)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), moderateTimeout)
	defer cancel()
	s.respond(msg, opModerate, start, s.moderate(ctx, &req))
}

// moderate checks a moderator's request against the room's settings and the target's tags, then
// applies it.
func (s *Service) moderate(ctx context.Context, req *buspb.ModerateBusRequest) *buspb.Reply {
	r := req.GetRequest()
	if rep := checkModerate(req); rep != nil {
		return rep
	}
	meta := s.cache.room(req.App, req.Room)
	if meta.GetStatus() == apipb.RoomStatus_ROOM_STATUS_CLOSED {
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room is closed")
	}
	st := meta.GetSettings()
	roomWide := s.holds(st.GetModeratorRoomExpr(), req.Tags, req.Uid)
	if !roomWide && !s.holds(st.GetModeratorExpr(), req.Tags, req.Uid) {
		return refuse(clientpb.ErrorCode_ERROR_CODE_NOT_MODERATOR, 0, "you are not a moderator of this room")
	}
	var scope []string // a scoped moderator's tags of the room's prefix
	if prefix := st.GetModeratorScopePrefix(); !roomWide && prefix != "" {
		for _, t := range req.Tags {
			if strings.HasPrefix(t, prefix) {
				scope = append(scope, t)
			}
		}
		if len(scope) == 0 {
			return refuse(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE, 0, fmt.Sprintf("you have no %s tag, so no member is in your scope", prefix))
		}
	}
	if r.Op == clientpb.ModerateOp_MODERATE_OP_RECALL {
		return s.moderateRecall(ctx, req, st, roomWide, scope)
	}
	sessions, rep := s.sessionsIn(ctx, req.App, req.Room, r.Uid)
	if rep != nil {
		return rep
	}
	if !roomWide {
		if rep := s.inScope(ctx, req, st, r.Uid, scope, sessions); rep != nil {
			return rep
		}
	}
	switch r.Op {
	case clientpb.ModerateOp_MODERATE_OP_MUTE, clientpb.ModerateOp_MODERATE_OP_UNMUTE:
		var until int64
		if r.DurationMs > 0 {
			until = s.cfg.Now().UnixMilli() + r.DurationMs
		}
		lift := r.Op == clientpb.ModerateOp_MODERATE_OP_UNMUTE
		if _, err := s.store.UpdateRestriction(ctx, req.App, req.Room, r.Uid, roomstore.Mute(lift, until)); err != nil {
			s.log.Warn("moderator's mute not written", "app", req.App, "room", req.Room, "uid", r.Uid, "err", err)
			return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the room's store did not take the mute")
		}
		return &buspb.Reply{Affected: int64(len(sessions))}
	default: // MODERATE_OP_REMOVE; checkModerate refused the rest
		reason := r.Reason
		if reason == "" {
			reason = removedReason
		}
		var kicked int64
		for node, ids := range byNode(sessions) {
			var rep buspb.NodeControlReply
			kick := &buspb.NodeControl{Op: buspb.NodeControl_OP_KICK, App: req.App, Room: req.Room, Uid: r.Uid, Sessions: ids, Reason: reason}
			if err := bus.Request(ctx, s.cfg.Bus, bus.NodeSubject(node), kick, &rep); err != nil {
				return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: fmt.Sprintf("node %s did not answer the removal", node), Affected: kicked}
			}
			kicked += rep.Affected
		}
		return &buspb.Reply{Affected: kicked}
	}
}

// checkModerate refuses a malformed moderate request.
func checkModerate(req *buspb.ModerateBusRequest) *buspb.Reply {
	r := req.GetRequest()
	bad := func(format string, args ...any) *buspb.Reply {
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, fmt.Sprintf(format, args...))
	}
	switch {
	case r == nil:
		return bad("a moderate request without its request")
	case clientpb.ModerateOp_name[int32(r.Op)] == "" || r.Op == clientpb.ModerateOp_MODERATE_OP_UNSPECIFIED:
		return bad("unknown op %d (mute 1, unmute 2, remove 3, recall 4)", r.Op)
	case r.Op == clientpb.ModerateOp_MODERATE_OP_RECALL && r.Uid != "":
		return bad("recall names the message, not the member: uid must be empty")
	case r.Op == clientpb.ModerateOp_MODERATE_OP_RECALL && !isMessageID(r.MessageId):
		return bad("message_id %q is not a message id (26 characters of Crockford base32)", r.MessageId)
	case r.Op != clientpb.ModerateOp_MODERATE_OP_RECALL && r.MessageId != "":
		return bad("message_id is for recall")
	case r.Op != clientpb.ModerateOp_MODERATE_OP_RECALL && !auth.ValidName(r.Uid):
		return bad("uid %q is not 1-128 characters of A-Z a-z 0-9 _ -", r.Uid)
	case r.Uid == req.Uid:
		return bad("a moderator does not act on themselves")
	case r.DurationMs < 0:
		return bad("duration_ms must not be negative")
	case r.DurationMs > maxMuteMs:
		return bad("duration_ms must be at most %d (a year); 0 mutes until unmuted", maxMuteMs)
	case r.DurationMs != 0 && r.Op != clientpb.ModerateOp_MODERATE_OP_MUTE:
		return bad("duration_ms is for mute")
	case r.Reason != "" && r.Op != clientpb.ModerateOp_MODERATE_OP_REMOVE:
		return bad("reason is for remove")
	case len(r.Reason) > maxModerateReason: // valid UTF-8: protobuf decodes no other string
		return bad("reason must be at most %d bytes", maxModerateReason)
	}
	return nil
}

// moderateRecall recalls a message of the room for a moderator. The member acted on is the
// message's sender as history keeps it, judged as a mute judges its target: by the tags of its
// sessions in the room now. A scoped moderator may not recall the app server's messages (they
// have no sender), nor a message whose sender has left the room (USER_NOT_FOUND: its scope
// cannot be judged); a room-wide moderator recalls any message. A message recalled before is
// answered as recalled, its Recall broadcast again (Recall).
func (s *Service) moderateRecall(ctx context.Context, req *buspb.ModerateBusRequest, st *roompb.RoomSettings, roomWide bool, scope []string) *buspb.Reply {
	r := req.Request
	if !roomWide {
		at, _ := ids.MessageTime(r.MessageId) // checkModerate checked it
		kept, recalled, err := s.find(ctx, req.App, req.Room, r.MessageId, at, true)
		switch {
		case err != nil:
			s.log.Warn("history not read for a moderator's recall", "app", req.App, "room", req.Room, "err", err)
			return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the room's history could not be read")
		case recalled != nil: // answered as recalled before (Recall)
		case kept == nil:
			return refuse(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND, 0, "the room's history holds no such message (never sent here, no longer kept, or a bulk message)")
		case kept.Msg.GetSender() == "":
			return refuse(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE, 0, "the message is the app server's: only room-wide moderators recall it")
		default:
			sender := kept.Msg.GetSender()
			sessions, rep := s.sessionsIn(ctx, req.App, req.Room, sender)
			if rep != nil {
				return rep
			}
			if rep := s.inScope(ctx, req, st, sender, scope, sessions); rep != nil {
				return rep
			}
		}
	}
	rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: req.App, Room: req.Room, MessageId: r.MessageId, ByUid: req.Uid})
	if rep.Code != 0 {
		return rep
	}
	return &buspb.Reply{Affected: 1}
}

// isMessageID reports whether id is a message id (26 characters of Crockford base32).
func isMessageID(id string) bool {
	_, ok := ids.MessageTime(id)
	return ok
}

// holds reports whether the tag expression src (a room setting, checked when it was set) holds
// for a member; an empty or broken one holds for nobody.
func (s *Service) holds(src string, tags []string, uid string) bool {
	if src == "" {
		return false
	}
	e, err := s.exprs.Get(src)
	return err == nil && e.EvalTags(tags, uid)
}

// sessionsIn returns uid's sessions in a room, as presence knows them: USER_NOT_FOUND when
// there are none.
func (s *Service) sessionsIn(ctx context.Context, app, room, uid string) ([]*buspb.SessionEvent, *buspb.Reply) {
	var rep buspb.PresenceReply
	if err := bus.Request(ctx, s.cfg.Bus, bus.SubjectPresenceSessions, &buspb.PresenceQuery{App: app, Uids: []string{uid}}, &rep); err != nil {
		return nil, refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "presence did not answer")
	}
	if rep.Code != 0 {
		return nil, &buspb.Reply{Code: rep.Code, Message: rep.Message}
	}
	sessions := slices.DeleteFunc(rep.Sessions, func(e *buspb.SessionEvent) bool { return e.Room != room })
	if len(sessions) == 0 {
		return nil, refuse(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, 0, fmt.Sprintf("%s has no session in this room", uid))
	}
	return sessions, nil
}

// inScope checks that each of the target's sessions in the room is within a scoped moderator's
// scope, by the tags its node holds for it now (the app server may have changed them since the
// login): it holds one of scope, the moderator's tags that start with the room's
// moderator_scope_prefix (any member, with no prefix), and it is not a room-wide moderator.
func (s *Service) inScope(ctx context.Context, req *buspb.ModerateBusRequest, st *roompb.RoomSettings, target string, scope []string, sessions []*buspb.SessionEvent) *buspb.Reply {
	prefix := st.GetModeratorScopePrefix()
	found := 0
	for node := range byNode(sessions) {
		var rep buspb.NodeControlReply
		// By uid, not by a tag expression reading uid: that is evaluated per member of the room.
		list := &buspb.NodeControl{Op: buspb.NodeControl_OP_MEMBERS, App: req.App, Room: req.Room, Uid: target}
		if err := bus.Request(ctx, s.cfg.Bus, bus.NodeSubject(node), list, &rep); err != nil {
			return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, fmt.Sprintf("node %s did not answer", node))
		}
		for _, m := range rep.Members {
			found++
			switch {
			case s.holds(st.GetModeratorRoomExpr(), m.Tags, m.Uid):
				return refuse(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE, 0, fmt.Sprintf("%s moderates the whole room: only room-wide moderators act on them", target))
			case prefix != "" && !slices.ContainsFunc(m.Tags, func(t string) bool { return slices.Contains(scope, t) }):
				return refuse(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE, 0, fmt.Sprintf("%s shares none of your %s tags (%s)", target, prefix, strings.Join(scope, ", ")))
			}
		}
	}
	if found == 0 {
		return refuse(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, 0, fmt.Sprintf("%s has no session in this room", target))
	}
	return nil
}

// byNode groups sessions' ids by their node.
func byNode(sessions []*buspb.SessionEvent) map[string][]string {
	out := make(map[string][]string)
	for _, e := range sessions {
		out[e.Node] = append(out[e.Node], e.SessionId)
	}
	return out
}
