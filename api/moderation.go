package api

import (
	"context"
	"slices"
	"time"
	"unicode/utf8"

	"roomcast/internal/auth"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/roomstore"
)

// Moderation: kick a user's sessions, or a room's members by tag expression; mute a room, or its
// members by tag expression; mute or ban a member of a room.

// Kick implements RoomcastAPI.
func (a *API) Kick(ctx context.Context, req *apipb.KickRequest) (*apipb.KickResponse, error) {
	app := appOf(ctx)
	if len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason) {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	if req.TagExpr != "" {
		return a.kickByTags(ctx, req)
	}
	switch {
	case !auth.ValidName(req.Uid):
		return nil, badName("uid", req.Uid)
	case req.Room != "" && !auth.ValidName(req.Room):
		return nil, badName("room", req.Room)
	}
	sessions, err := a.sessionsOf(ctx, app, req.Uid)
	if err != nil {
		return nil, err
	}
	sessions = slices.DeleteFunc(sessions, func(s *buspb.SessionEvent) bool {
		return (req.Room != "" && s.Room != req.Room) || (req.SessionId != "" && s.SessionId != req.SessionId)
	})
	if len(sessions) == 0 {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "user %q has no such session online", req.Uid)
	}
	n, err := a.toNodes(ctx, sessions, &buspb.NodeControl{Op: buspb.NodeControl_OP_KICK, App: app, Reason: req.Reason})
	if err != nil {
		return nil, err
	}
	return &apipb.KickResponse{Kicked: n}, nil
}

// kickByTags closes every session in a room whose member's tags satisfy req.TagExpr: each node
// holding the room, as the room service knows them from their reports, closes its own and says
// how many. Then every node is told, for a node that took its first member of the room since its
// last report: what it closes is not counted. A node that fails fails the call; the others may
// have kicked already, so a retry is safe (it finds fewer).
func (a *API) kickByTags(ctx context.Context, req *apipb.KickRequest) (*apipb.KickResponse, error) {
	app := appOf(ctx)
	switch {
	case req.Room == "":
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a kick by tag_expr needs room")
	case req.Uid != "" || req.SessionId != "":
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a kick by tag_expr names no uid or session_id (POST /v1/rooms/{room}/kick)")
	}
	if err := a.checkTagExpr("tag_expr", req.TagExpr); err != nil {
		return nil, err
	}
	_, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	kick := &buspb.NodeControl{Op: buspb.NodeControl_OP_KICK_EXPR, App: app, Room: req.Room, TagExpr: req.TagExpr, Reason: req.Reason}
	reps, err := a.askNodes(ctx, roomNodes(info, ""), kick)
	if err != nil {
		return nil, err
	}
	if err := a.broadcast(kick); err != nil {
		return nil, err
	}
	out := &apipb.KickResponse{}
	for _, rep := range reps {
		out.Kicked += rep.Affected
	}
	return out, nil
}

// MuteRoom implements RoomcastAPI.
func (a *API) MuteRoom(ctx context.Context, req *apipb.MuteRoomRequest) (*apipb.Room, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if req.TagExpr != "" {
		return a.muteByTags(ctx, req)
	}
	if req.DurationMs != 0 {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "duration_ms is for a mute by tag_expr; a room mute holds until lifted")
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.UpdateRoom(ctx, appOf(ctx), req.Room, func(r *apipb.Room) error {
		r.Muted, r.UpdatedMs = req.Muted, time.Now().UnixMilli()
		return nil
	})
	return r, a.storeError("mute room", req.Room, err)
}

// muteByTags adds to a room's tag mutes (or, muted false, lifts one): the room service then
// refuses sends from members whose tags satisfy the expression. Muting an expression again sets
// its time anew; lifting one the room does not hold changes nothing. Mutes past their time are
// dropped at each change.
func (a *API) muteByTags(ctx context.Context, req *apipb.MuteRoomRequest) (*apipb.Room, error) {
	if err := durationError(req.DurationMs); err != nil {
		return nil, err
	}
	if err := a.checkTagExpr("tag_expr", req.TagExpr); err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.UpdateRoom(ctx, appOf(ctx), req.Room, func(r *apipb.Room) error {
		now := time.Now()
		r.TagMutes = slices.DeleteFunc(r.TagMutes, func(m *apipb.TagMute) bool {
			return m.TagExpr == req.TagExpr || !roomstore.TagMuteHolds(m, now)
		})
		if req.Muted {
			if len(r.TagMutes) >= roomstore.MaxTagMutes {
				return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "room %q holds %d tag mutes, the limit: lift one first", req.Room, len(r.TagMutes))
			}
			m := &apipb.TagMute{TagExpr: req.TagExpr, CreatedMs: now.UnixMilli()}
			if req.DurationMs > 0 {
				m.UntilMs = now.UnixMilli() + req.DurationMs
			}
			r.TagMutes = append(r.TagMutes, m)
		}
		r.UpdatedMs = now.UnixMilli()
		return nil
	})
	return r, a.storeError("mute room by tags", req.Room, err)
}

// maxDurationMs bounds a timed mute or ban (ten years): past it the end time would overflow
// into the past and the restriction would lift itself at once. 0 holds until lifted.
const maxDurationMs = 10 * 365 * 24 * 60 * 60 * 1000

// durationError checks a mute's or ban's duration_ms.
func durationError(ms int64) error {
	switch {
	case ms < 0:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "duration_ms must not be negative")
	case ms > maxDurationMs:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "duration_ms must be at most %d (ten years); 0 holds until lifted", int64(maxDurationMs))
	}
	return nil
}

// restrict checks a mute or ban request and writes it.
func (a *API) restrict(ctx context.Context, room, uid string, duration int64, change func(r *apipb.MemberRestriction, until int64)) (*apipb.MemberRestriction, error) {
	app := appOf(ctx)
	switch {
	case !auth.ValidName(uid):
		return nil, badName("uid", uid)
	case durationError(duration) != nil:
		return nil, durationError(duration)
	}
	if _, _, err := a.existing(ctx, app, room); err != nil {
		return nil, err
	}
	var until int64
	if duration > 0 {
		until = time.Now().UnixMilli() + duration
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.UpdateRestriction(ctx, app, room, uid, func(r *apipb.MemberRestriction) { change(r, until) })
	if err != nil {
		return nil, a.internal("write restriction", err)
	}
	return r, nil
}

// MuteMember implements RoomcastAPI.
func (a *API) MuteMember(ctx context.Context, req *apipb.MuteMemberRequest) (*apipb.MemberRestriction, error) {
	return a.restrict(ctx, req.Room, req.Uid, req.DurationMs, func(r *apipb.MemberRestriction, until int64) {
		roomstore.Mute(req.Lift, until)(r)
	})
}

// BanMember implements RoomcastAPI. The ban is written first, so the room service refuses the
// user's next logins; then every node is told, so it kicks the user's sessions in the room and
// refuses the logins that passed the room service's check just before.
func (a *API) BanMember(ctx context.Context, req *apipb.BanMemberRequest) (*apipb.BanMemberResponse, error) {
	if len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason) {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	r, err := a.restrict(ctx, req.Room, req.Uid, req.DurationMs, func(r *apipb.MemberRestriction, until int64) {
		r.Banned, r.BannedUntilMs, r.Reason = !req.Lift, until, req.Reason
		if req.Lift {
			r.BannedUntilMs, r.Reason = 0, ""
		}
	})
	if err != nil {
		return nil, err
	}
	if req.Lift {
		// The nodes forget the ban too, or they would refuse the user's next login for a while.
		if err := a.broadcast(&buspb.NodeControl{Op: buspb.NodeControl_OP_BAN, App: appOf(ctx), Room: req.Room, Uid: req.Uid, Lift: true}); err != nil {
			return nil, err
		}
		return &apipb.BanMemberResponse{Restriction: r}, nil
	}
	sessions, err := a.sessionsOf(ctx, appOf(ctx), req.Uid)
	if err != nil {
		return nil, err
	}
	var kicked int64
	for _, s := range sessions {
		if s.Room == req.Room {
			kicked++
		}
	}
	reason := req.Reason
	if reason == "" {
		reason = "banned from this room"
	}
	if err := a.broadcast(&buspb.NodeControl{Op: buspb.NodeControl_OP_BAN, App: appOf(ctx), Room: req.Room, Uid: req.Uid, Reason: reason}); err != nil {
		return nil, err
	}
	return &apipb.BanMemberResponse{Restriction: r, Kicked: kicked}, nil
}
