package api

import (
	"context"
	"time"

	"roomcast/internal/auth"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/cdnstore"
)

// CDN calls: a room's CDN mode and an app's CDN policy. The API stores what the app asks for
// (cdnstore.Store); the CDN manager decides what is in force and tells the members.

// SetRoomCdn implements RoomcastAPI. A room need not exist yet: a pin set before an event holds
// from its first login.
func (a *API) SetRoomCdn(ctx context.Context, req *apipb.SetRoomCdnRequest) (*apipb.RoomCdn, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if clientpb.CdnMode_name[int32(req.Mode)] == "" {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown mode %d", req.Mode)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	if err := a.cdn.SetRoomCdn(ctx, app, req.Room, req.Automatic, req.Mode); err != nil {
		return nil, a.internal("set room CDN mode", err)
	}
	return a.roomCdn(ctx, app, req.Room)
}

// GetRoomCdn implements RoomcastAPI.
func (a *API) GetRoomCdn(ctx context.Context, req *apipb.GetRoomCdnRequest) (*apipb.RoomCdn, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	return a.roomCdn(ctx, appOf(ctx), req.Room)
}

func (a *API) roomCdn(ctx context.Context, app, room string) (*apipb.RoomCdn, error) {
	rc, err := a.cdn.RoomCdn(ctx, app, room)
	if err != nil {
		return nil, a.internal("read room CDN mode", err)
	}
	return rc, nil
}

// SetCdnPolicy implements RoomcastAPI.
func (a *API) SetCdnPolicy(ctx context.Context, req *apipb.CdnPolicy) (*apipb.CdnPolicy, error) {
	if err := cdnstore.CheckPolicy(req); err != nil {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	}
	app := appOf(ctx)
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	req.UpdatedMs = time.Now().UnixMilli()
	if err := a.cdn.SetPolicy(ctx, app, req); err != nil {
		return nil, a.internal("set CDN policy", err)
	}
	return req, nil
}

// GetCdnPolicy implements RoomcastAPI.
func (a *API) GetCdnPolicy(ctx context.Context, _ *apipb.GetCdnPolicyRequest) (*apipb.CdnPolicy, error) {
	app := appOf(ctx)
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	p, err := a.cdn.Policy(ctx, app)
	if err != nil {
		return nil, a.internal("read CDN policy", err)
	}
	return p, nil
}
