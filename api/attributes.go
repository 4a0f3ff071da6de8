package api

import (
	"context"
	"errors"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/attrstore"
)

// Room attributes (docs/api.md, "Room attributes"): a room's small key/value set, an
// announcement or a pinned message, written to their store (store/attrstore) and broadcast on the
// room's subject, where the ChatLinks pass the whole set to their members.

// GetRoomAttributes implements RoomcastAPI.
func (a *API) GetRoomAttributes(ctx context.Context, req *apipb.GetRoomAttributesRequest) (*clientpb.RoomAttributes, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	attrs, err := a.attrs.Get(ctx, appOf(ctx), req.Room)
	if err != nil {
		return nil, a.internal("read room attributes", err)
	}
	return attrs, nil
}

// SetRoomAttribute implements RoomcastAPI.
func (a *API) SetRoomAttribute(ctx context.Context, req *apipb.SetRoomAttributeRequest) (*clientpb.RoomAttributes, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	app := appOf(ctx)
	attrs, err := a.attrs.Set(ctx, app, req.Room, req.Key, req.Value, req.Remove, time.Now())
	switch {
	case errors.Is(err, attrstore.ErrBadKey):
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	case errors.Is(err, attrstore.ErrLimit):
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_FULL, "%v", err)
	case err != nil:
		return nil, a.internal("write room attributes", err)
	}
	if err := bus.Publish(a.cfg.Bus, bus.RoomSubject(app, req.Room), &buspb.RoomBatch{Attributes: attrs}); err != nil {
		// Stored: later logins have it; members online learn of the next change.
		a.log.Warn("room attributes change not broadcast", "app", app, "room", req.Room, "err", err)
	}
	return attrs, nil
}
