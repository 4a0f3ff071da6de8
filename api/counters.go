package api

import (
	"context"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/counterstore"
)

// Counters (docs/api.md, "Counters"): a room's likes and gifts, summed from its members' adds by
// the ChatLinks and the room service. The API reads them from their store and resets them
// through the room service, which broadcasts the change to the room.

// GetCounters implements RoomcastAPI.
func (a *API) GetCounters(ctx context.Context, req *apipb.GetCountersRequest) (*clientpb.CounterTotals, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	rec, rev, err := a.counters.Get(ctx, appOf(ctx), req.Room)
	if err != nil {
		return nil, a.internal("read counters", err)
	}
	return counterstore.Totals(rec, rev), nil
}

// ResetCounter implements RoomcastAPI. Resetting a counter the room does not have is no error.
func (a *API) ResetCounter(ctx context.Context, req *apipb.ResetCounterRequest) (*clientpb.CounterTotals, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if !counterstore.ValidName(req.Name) {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "counter name must be 1 to %d characters of A-Z a-z 0-9 _ - : ., not %q", counterstore.MaxNameLen, req.Name)
	}
	var rep buspb.Reply
	if err := a.ask(ctx, bus.SubjectRoomCounters, &buspb.CounterWindow{App: appOf(ctx), Room: req.Room, Resets: []string{req.Name}}, &rep); err != nil {
		return nil, err
	}
	if rep.Counters == nil {
		return &clientpb.CounterTotals{}, nil
	}
	return rep.Counters, nil
}
