package api

import (
	"context"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// RecallMessage implements RoomcastAPI (docs/api.md, "Recall"): the room service takes the
// message out of the room's history and broadcasts the recall (room/recall.go).
func (a *API) RecallMessage(ctx context.Context, req *apipb.RecallMessageRequest) (*apipb.RecallMessageResponse, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if _, ok := ids.MessageTime(req.MessageId); !ok {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "message_id %q is not a message id (26 characters of Crockford base32)", req.MessageId)
	}
	var rep buspb.Reply
	err := a.ask(ctx, bus.SubjectRoomRecall, &buspb.RoomRecallRequest{App: appOf(ctx), Room: req.Room, MessageId: req.MessageId, Unkept: req.Unkept}, &rep)
	if err != nil {
		return nil, err
	}
	return &apipb.RecallMessageResponse{MessageId: req.MessageId, RecalledMs: rep.GetRecalled().GetRecalledMs(), AlreadyRecalled: rep.AlreadyRecalled}, nil
}
