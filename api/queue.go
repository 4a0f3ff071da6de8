package api

import (
	"context"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// Room queue calls: each asks the room queue service (roomqueue) as the app server, which the
// room's queue_expr and queue_admin_expr do not bind.

func (a *API) queue(ctx context.Context, op clientpb.QueueOp, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	var rep buspb.Reply
	if err := a.ask(ctx, bus.SubjectQueue, &buspb.QueueBusRequest{App: appOf(ctx), Op: op, Request: req}, &rep); err != nil {
		return nil, err
	}
	if rep.Queue == nil {
		return &roompb.QueueResponse{}, nil
	}
	return rep.Queue, nil
}

// OfferQueue implements RoomcastAPI.
func (a *API) OfferQueue(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_OFFER, req)
}

// PollQueue implements RoomcastAPI.
func (a *API) PollQueue(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_POLL, req)
}

// PeekQueue implements RoomcastAPI.
func (a *API) PeekQueue(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_PEEK, req)
}

// ListQueue implements RoomcastAPI.
func (a *API) ListQueue(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_LIST, req)
}

// RemoveQueueEntry implements RoomcastAPI.
func (a *API) RemoveQueueEntry(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_REMOVE, req)
}

// ClearQueue implements RoomcastAPI.
func (a *API) ClearQueue(ctx context.Context, req *roompb.QueueRequest) (*roompb.QueueResponse, error) {
	return a.queue(ctx, clientpb.QueueOp_QUEUE_OP_CLEAR, req)
}
