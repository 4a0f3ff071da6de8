package api

import (
	"context"
	"time"

	"roomcast/internal/auth"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// Users: their sessions and member tags. The app's online counts are in online.go.

// GetUserSessions implements RoomcastAPI.
func (a *API) GetUserSessions(ctx context.Context, req *pb.GetUserSessionsRequest) (*pb.GetUserSessionsResponse, error) {
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	sessions, err := a.sessionsOf(ctx, appOf(ctx), req.Uid)
	if err != nil {
		return nil, err
	}
	out := &pb.GetUserSessionsResponse{Uid: req.Uid, Online: len(sessions) > 0, Sessions: []*pb.Session{}}
	for _, s := range sessions {
		out.Sessions = append(out.Sessions, &pb.Session{SessionId: s.SessionId, Uid: s.Uid, Room: s.Room, Node: s.Node, Device: s.Device, LoginTimeMs: s.TimeMs})
	}
	return out, nil
}

// SetMemberTags implements RoomcastAPI.
func (a *API) SetMemberTags(ctx context.Context, req *pb.SetMemberTagsRequest) (*pb.SetMemberTagsResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	if err := tag.Validate(req.Tags); err != nil {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	t := &pb.MemberTags{Uid: req.Uid, Tags: tag.Canonical(req.Tags), UpdatedMs: time.Now().UnixMilli()}
	if err := a.store.PutMemberTags(ctx, app, t); err != nil {
		return nil, a.internal("set member tags", err)
	}
	sessions, err := a.sessionsOf(ctx, app, req.Uid)
	if err != nil {
		return nil, err
	}
	n, err := a.toNodes(ctx, sessions, &pb.NodeControl{Op: pb.NodeControl_OP_SET_TAGS, App: app, Tags: t.Tags})
	if err != nil {
		return nil, err
	}
	return &pb.SetMemberTagsResponse{Tags: t, SessionsUpdated: n}, nil
}

// GetMemberTags implements RoomcastAPI.
func (a *API) GetMemberTags(ctx context.Context, req *pb.GetMemberTagsRequest) (*pb.MemberTags, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	t, err := a.store.MemberTags(ctx, app, req.Uid)
	if err != nil {
		return nil, a.internal("get member tags", err)
	}
	if t == nil {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "no tags stored for user %q: it has its login token's", req.Uid)
	}
	return t, nil
}
