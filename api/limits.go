package api

import (
	"context"
	"time"

	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/applimits"
)

// appLimitsMaxAge is how old the API's copy of an app's limits may be: a change applies to
// calls within about this long.
const appLimitsMaxAge = time.Second

// SetAppLimits implements RoomcastAPI.
func (a *API) SetAppLimits(ctx context.Context, req *apipb.AppLimits) (*apipb.AppLimits, error) {
	if _, err := applimits.Parse(req); err != nil {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	}
	app := appOf(ctx)
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	req.UpdatedMs = time.Now().UnixMilli()
	if err := a.limitStore.Put(ctx, app, req); err != nil {
		return nil, a.internal("set app limits", err)
	}
	return req, nil
}

// GetAppLimits implements RoomcastAPI.
func (a *API) GetAppLimits(ctx context.Context, _ *apipb.GetAppLimitsRequest) (*apipb.AppLimits, error) {
	app := appOf(ctx)
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	l, err := a.limitStore.Get(ctx, app)
	if err != nil {
		return nil, a.internal("read app limits", err)
	}
	return l, nil
}
