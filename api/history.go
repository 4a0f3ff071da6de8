package api

import (
	"context"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// GetHistory implements RoomcastAPI: the room service reads and pages the history
// (room/historyquery.go); the API checks what it can without it.
func (a *API) GetHistory(ctx context.Context, req *apipb.GetHistoryRequest) (*clientpb.HistoryPage, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	var lane clientpb.Lane
	if req.Lane != "" {
		l, ok := ParseLane(req.Lane)
		if !ok || l == clientpb.Lane_LANE_BULK {
			return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY, "lane must be critical or normal, not %q (bulk messages are not kept)", req.Lane)
		}
		lane = l
	}
	if req.AsMember {
		if err := tag.Validate(req.Tags); err != nil {
			return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tags: %v", err)
		}
	} else if req.Uid != "" || len(req.Tags) > 0 {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY, "uid and tags name a member to see the history as: set as_member too")
	}
	hr := &buspb.HistoryRequest{
		App: appOf(ctx), Room: req.Room, AsMember: req.AsMember, Uid: req.Uid, Tags: req.Tags,
		Query: &clientpb.HistoryQuery{Limit: req.Limit, BeforeId: req.BeforeId, AfterId: req.AfterId, Cursor: req.Cursor, Lane: lane},
	}
	var rep buspb.Reply
	if err := a.read(ctx, bus.SubjectRoomHistory, hr, &rep); err != nil {
		return nil, err
	}
	page := rep.History
	if page == nil {
		page = &clientpb.HistoryPage{}
	}
	return page, nil
}
