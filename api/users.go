package api

import (
	"context"
	"errors"
	"slices"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/inbox"
	"roomcast/tag"
)

// Users: their sessions, member tags, and the at-least-once messages stored for them. The
// app's online counts are in online.go.

// GetUserSessions implements RoomcastAPI.
func (a *API) GetUserSessions(ctx context.Context, req *apipb.GetUserSessionsRequest) (*apipb.GetUserSessionsResponse, error) {
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	sessions, err := a.sessionsOf(ctx, appOf(ctx), req.Uid)
	if err != nil {
		return nil, err
	}
	out := &apipb.GetUserSessionsResponse{Uid: req.Uid, Online: len(sessions) > 0, Sessions: []*apipb.Session{}}
	for _, s := range sessions {
		out.Sessions = append(out.Sessions, &apipb.Session{SessionId: s.SessionId, Uid: s.Uid, Room: s.Room, Node: s.Node, Device: s.Device, LoginTimeMs: s.TimeMs})
	}
	return out, nil
}

// SetMemberTags implements RoomcastAPI.
func (a *API) SetMemberTags(ctx context.Context, req *apipb.SetMemberTagsRequest) (*apipb.SetMemberTagsResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	if err := tag.Validate(req.Tags); err != nil {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	t := &roompb.MemberTags{Uid: req.Uid, Tags: tag.Canonical(req.Tags), UpdatedMs: time.Now().UnixMilli()}
	if err := a.store.PutMemberTags(ctx, app, t); err != nil {
		return nil, a.internal("set member tags", err)
	}
	sessions, err := a.sessionsOf(ctx, app, req.Uid)
	if err != nil {
		return nil, err
	}
	n, err := a.toNodes(ctx, sessions, &buspb.NodeControl{Op: buspb.NodeControl_OP_SET_TAGS, App: app, Tags: t.Tags})
	if err != nil {
		return nil, err
	}
	return &apipb.SetMemberTagsResponse{Tags: t, SessionsUpdated: n}, nil
}

// GetMemberTags implements RoomcastAPI.
func (a *API) GetMemberTags(ctx context.Context, req *apipb.GetMemberTagsRequest) (*roompb.MemberTags, error) {
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
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "no tags stored for user %q: it has its login token's", req.Uid)
	}
	return t, nil
}

// storeForUsers stores m, marked at-least-once, for each user of req (once per uid however often
// it is listed) and returns the uids it was stored for; out gets the expiry and the uids whose
// store was full. It fails with INBOX_FULL when the message was stored for no one, and with
// UNAVAILABLE when the store did not answer: the users listed before the one that failed may
// have it already, and a retry stores it again under a new id.
func (a *API) storeForUsers(ctx context.Context, app string, req *apipb.SendToUsersRequest, m *clientpb.Message, out *apipb.SendToUsersResponse) ([]string, error) {
	expiry := a.cfg.Inbox.Expiry
	if req.ExpirySeconds > 0 {
		expiry = time.Duration(req.ExpirySeconds) * time.Second
	}
	if expiry > a.cfg.Inbox.MaxExpiry {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "expiry_seconds %d is longer than the deployment allows (%d)", req.ExpirySeconds, int64(a.cfg.Inbox.MaxExpiry/time.Second))
	}
	m.AtLeastOnce, m.ExpiresMs = true, m.ServerTimeMs+expiry.Milliseconds()
	out.ExpiresMs, out.InboxFull = m.ExpiresMs, []string{}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	var stored []string
	for _, uid := range req.Uids {
		if slices.Contains(stored, uid) || slices.Contains(out.InboxFull, uid) {
			continue
		}
		switch err := a.inbox.Put(ctx, app, uid, m, expiry); {
		case errors.Is(err, inbox.ErrFull):
			a.log.Info("at-least-once message not stored: the user's store is full", "uid", uid, "id", m.Id)
			out.InboxFull = append(out.InboxFull, uid)
		case err != nil:
			return nil, apiError(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, "the message store did not answer (stored for %d of the users before %q): %v", len(stored), uid, err)
		default:
			stored = append(stored, uid)
		}
	}
	if len(stored) == 0 {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_INBOX_FULL, "every user named has %d messages stored, as many as allowed: nothing was stored", a.cfg.Inbox.MaxPerUser)
	}
	return stored, nil
}
