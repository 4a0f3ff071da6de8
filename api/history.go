package api

import (
	"context"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// GetHistory implements RoomcastAPI: the room service reads and pages the history
// (room/historyquery.go); the API checks what it can without it.
func (a *API) GetHistory(ctx context.Context, req *pb.GetHistoryRequest) (*pb.HistoryPage, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	var lane pb.Lane
	if req.Lane != "" {
		l, ok := ParseLane(req.Lane)
		if !ok || l == pb.Lane_LANE_BULK {
			return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY, "lane must be critical or normal, not %q (bulk messages are not kept)", req.Lane)
		}
		lane = l
	}
	if req.AsMember {
		if err := tag.Validate(req.Tags); err != nil {
			return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tags: %v", err)
		}
	} else if req.Uid != "" || len(req.Tags) > 0 {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY, "uid and tags name a member to see the history as: set as_member too")
	}
	hr := &pb.HistoryRequest{
		App: appOf(ctx), Room: req.Room, AsMember: req.AsMember, Uid: req.Uid, Tags: req.Tags,
		Query: &pb.HistoryQuery{Limit: req.Limit, BeforeId: req.BeforeId, AfterId: req.AfterId, Cursor: req.Cursor, Lane: lane},
	}
	var rep pb.Reply
	if err := a.read(ctx, bus.SubjectRoomHistory, hr, &rep); err != nil {
		return nil, err
	}
	page := rep.History
	if page == nil {
		page = &pb.HistoryPage{}
	}
	return page, nil
}
