package api

import (
	"context"
	"time"
	"unicode/utf8"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/attrstore"
	"roomcast/tag"
)

// Room calls: create, update, close and get a room, and the checks of a room's fields and
// settings.

func (a *API) roomInfo(ctx context.Context, app, room string) (*buspb.RoomInfo, error) {
	var rep buspb.Reply
	if err := a.read(ctx, bus.SubjectRoomInfo, &buspb.JoinRequest{App: app, Room: room}, &rep); err != nil {
		return nil, err
	}
	return rep.Room, nil
}

// existing returns a room's record (nil for an implicit room) and its members online; a room
// that was never created and has nobody online does not exist.
func (a *API) existing(ctx context.Context, app, room string) (*apipb.Room, *buspb.RoomInfo, error) {
	if !auth.ValidName(room) {
		return nil, nil, badName("room", room)
	}
	meta, _, err := a.store.Room(ctx, app, room)
	if err != nil {
		return nil, nil, a.internal("read room", err)
	}
	info, err := a.roomInfo(ctx, app, room)
	if err != nil {
		return nil, nil, err
	}
	if meta == nil && info.Online == 0 {
		return nil, nil, apiError(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, "room %q does not exist", room)
	}
	return meta, info, nil
}

func (a *API) checkSettings(s *roompb.RoomSettings) error {
	switch {
	case s == nil:
		return nil
	case s.FlushTickMs > MaxFlushTickMS:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "flush_tick_ms must be at most %d", MaxFlushTickMS)
	case s.LatencyBudgetMs > MaxLatencyBudgetMS:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "latency_budget_ms must be at most %d", MaxLatencyBudgetMS)
	case s.GatherMessages > MaxGatherMessages:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "gather_messages must be at most %d", MaxGatherMessages)
	case s.ScopePrefix != "" && tag.Validate([]string{s.ScopePrefix}) != nil:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "scope_prefix %q is not the start of a valid tag", s.ScopePrefix)
	case s.ModeratorScopePrefix != "" && tag.Validate([]string{s.ModeratorScopePrefix}) != nil:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "moderator_scope_prefix %q is not the start of a valid tag", s.ModeratorScopePrefix)
	case s.MaxMembers < 0:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "max_members must not be negative")
	case s.BulkPerSecond < -1:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "bulk_per_second must be -1 (no cap), 0 (the default) or positive")
	case s.MemberCriticalPerSecond < -1:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "member_critical_per_second must be -1 (no cap), 0 (the default) or positive")
	case roompb.SendPolicy_name[int32(s.WhoMaySend)] == "":
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown who_may_send %d", s.WhoMaySend)
	case len(s.ViewerTags) > MaxViewerTags:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "viewer_tags: at most %d tags", MaxViewerTags)
	case tag.Validate(s.ViewerTags) != nil:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "viewer_tags: %v", tag.Validate(s.ViewerTags))
	case s.SenderRecallWindowS > MaxSenderRecallWindowS:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "sender_recall_window_s must be at most %d", MaxSenderRecallWindowS)
	case len(s.AttributeKeys) > attrstore.MaxKeys:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "attribute_keys: at most %d keys", attrstore.MaxKeys)
	}
	for _, k := range s.AttributeKeys {
		if !attrstore.ValidKey(k) {
			return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "attribute_keys: %q is not a valid key (1 to %d characters of A-Z a-z 0-9 _ - : .)", k, attrstore.MaxKeyLen)
		}
	}
	for name, src := range map[string]string{"send_expr": s.SendExpr, "broadcast_expr": s.BroadcastExpr, "critical_expr": s.CriticalExpr,
		"queue_expr": s.QueueExpr, "queue_admin_expr": s.QueueAdminExpr, "attributes_expr": s.AttributesExpr,
		"moderator_expr": s.ModeratorExpr, "moderator_room_expr": s.ModeratorRoomExpr} {
		if src == "" {
			continue
		}
		if _, err := a.exprs.Get(src); err != nil {
			return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR, "%s: %v", name, err)
		}
	}
	return nil
}

// MaxSenderRecallWindowS bounds how long after sending a member may recall a message
// (sender_recall_window_s, seconds; the room service holds to the same hour).
const MaxSenderRecallWindowS = 3600

// MaxViewerTags bounds the tags a room's viewer counts count on their own (viewer_tags).
const MaxViewerTags = 16

// MaxFlushTickMS bounds a room's flush tick.
const MaxFlushTickMS = 1000

// MaxLatencyBudgetMS and MaxGatherMessages bound how long a room's messages may wait for
// company and how many make its frame go (latency_budget_ms, gather_messages).
const (
	MaxLatencyBudgetMS = 5000
	MaxGatherMessages  = 64
)

// announceSettings tells the ChatLinks holding a room that its settings changed; they apply
// them in order with the room's messages.
func (a *API) announceSettings(app string, r *apipb.Room) {
	if r == nil {
		return
	}
	settings := r.Settings
	if settings == nil {
		settings = &roompb.RoomSettings{}
	}
	if err := bus.Publish(a.cfg.Bus, bus.RoomSubject(app, r.Room), &buspb.RoomBatch{Settings: settings}); err != nil {
		a.log.Warn("settings change not announced", "app", app, "room", r.Room, "err", err)
	}
}

func checkRoomFields(name, owner string) error {
	switch {
	case len(name) > maxNameBytes || !utf8.ValidString(name):
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "name must be valid UTF-8 of at most %d bytes", maxNameBytes)
	case owner != "" && !auth.ValidName(owner):
		return badName("owner", owner)
	}
	return nil
}

// CreateRoom implements RoomcastAPI.
func (a *API) CreateRoom(ctx context.Context, req *apipb.CreateRoomRequest) (*apipb.CreateRoomResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if err := checkRoomFields(req.Name, req.Owner); err != nil {
		return nil, err
	}
	if err := a.checkSettings(req.Settings); err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	now := time.Now().UnixMilli()
	settings := req.Settings
	if settings == nil {
		settings = &roompb.RoomSettings{}
	}
	r := &apipb.Room{Room: req.Room, Name: req.Name, Owner: req.Owner, CreatedMs: now, UpdatedMs: now, Status: apipb.RoomStatus_ROOM_STATUS_OPEN, Settings: settings}
	created, err := a.store.CreateRoom(ctx, app, r)
	if err != nil {
		return nil, a.internal("create room", err)
	}
	if created {
		// Members may be in the room already: rooms open implicitly at their first login.
		a.announceSettings(app, r)
		return &apipb.CreateRoomResponse{Room: r, Created: true}, nil
	}
	reopened := false
	r, err = a.store.UpdateRoom(ctx, app, req.Room, func(old *apipb.Room) error {
		reopened = old.Status == apipb.RoomStatus_ROOM_STATUS_CLOSED
		if reopened {
			old.Name, old.Owner, old.Settings, old.Status, old.CloseReason, old.Muted, old.UpdatedMs = req.Name, req.Owner, settings, apipb.RoomStatus_ROOM_STATUS_OPEN, "", false, now
			old.TagMutes = nil
		}
		return nil
	})
	if err != nil {
		return nil, a.internal("create room", err)
	}
	if reopened {
		a.announceSettings(app, r)
		// The nodes forget the close, or they would refuse logins for a while.
		if err := a.broadcast(&buspb.NodeControl{Op: buspb.NodeControl_OP_CLOSE_ROOM, App: app, Room: req.Room, Lift: true}); err != nil {
			return nil, err
		}
	}
	return &apipb.CreateRoomResponse{Room: r, Created: reopened}, nil
}

// UpdateRoom implements RoomcastAPI.
func (a *API) UpdateRoom(ctx context.Context, req *apipb.UpdateRoomRequest) (*apipb.Room, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if err := checkRoomFields(req.GetName(), req.GetOwner()); err != nil {
		return nil, err
	}
	if err := a.checkSettings(req.Settings); err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.UpdateRoom(ctx, app, req.Room, func(r *apipb.Room) error {
		if r.Status == apipb.RoomStatus_ROOM_STATUS_CLOSED {
			return apiError(clientpb.ErrorCode_ERROR_CODE_CONFLICT, "room %q is closed; create it again to reopen it", req.Room)
		}
		if req.Name != nil {
			r.Name = *req.Name
		}
		if req.Owner != nil {
			r.Owner = *req.Owner
		}
		if req.Settings != nil {
			r.Settings = req.Settings
		}
		r.UpdatedMs = time.Now().UnixMilli()
		return nil
	})
	if err == nil && req.Settings != nil {
		a.announceSettings(app, r)
	}
	return r, a.storeError("update room", req.Room, err)
}

// CloseRoom implements RoomcastAPI.
func (a *API) CloseRoom(ctx context.Context, req *apipb.CloseRoomRequest) (*apipb.CloseRoomResponse, error) {
	app := appOf(ctx)
	if len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason) {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	meta, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	now := time.Now().UnixMilli()
	closeIt := func(r *apipb.Room) error {
		r.Status, r.CloseReason, r.UpdatedMs = apipb.RoomStatus_ROOM_STATUS_CLOSED, req.Reason, now
		return nil
	}
	if meta == nil {
		// An implicit room with members: record it, closed.
		r := &apipb.Room{Room: req.Room, CreatedMs: now, Settings: &roompb.RoomSettings{}}
		_ = closeIt(r)
		if _, err := a.store.CreateRoom(ctx, app, r); err != nil {
			return nil, a.internal("close room", err)
		}
	}
	r, err := a.store.UpdateRoom(ctx, app, req.Room, closeIt)
	if err != nil {
		return nil, a.storeError("close room", req.Room, err)
	}
	reason := req.Reason
	if reason == "" {
		reason = "room closed"
	}
	if err := a.broadcast(&buspb.NodeControl{Op: buspb.NodeControl_OP_CLOSE_ROOM, App: app, Room: req.Room, Reason: reason}); err != nil {
		return nil, err
	}
	return &apipb.CloseRoomResponse{Room: r, Kicked: info.Online}, nil
}

// GetRoom implements RoomcastAPI.
func (a *API) GetRoom(ctx context.Context, req *apipb.GetRoomRequest) (*apipb.GetRoomResponse, error) {
	meta, info, err := a.existing(ctx, appOf(ctx), req.Room)
	if err != nil {
		return nil, err
	}
	return &apipb.GetRoomResponse{Room: req.Room, Online: info.Online, Nodes: info.Nodes, Meta: meta}, nil
}
