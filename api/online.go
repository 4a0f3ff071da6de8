package api

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// Online counts: the app's sessions and users, from presence; a room's members in total, per tag
// expression and per tag, from the nodes that hold the room. Presence does not know tags, and
// the nodes' reports do not carry counts per tag (every room, every second, asked or not), so a
// count by tags asks each node once; a node counts by the room's distinct tag sets, not by
// member (docs/tags.md).

// maxTagCounts bounds the distinct tags one CountOnline by tag_prefix answers.
const maxTagCounts = 1000

// CountOnline implements RoomcastAPI.
func (a *API) CountOnline(ctx context.Context, req *apipb.CountOnlineRequest) (*apipb.CountOnlineResponse, error) {
	app := appOf(ctx)
	if err := a.checkCountRequest(req); err != nil {
		return nil, err
	}
	var rep buspb.PresenceReply
	if err := a.read(ctx, bus.SubjectPresenceCount, &buspb.PresenceQuery{App: app}, &rep); err != nil {
		return nil, err
	}
	out := &apipb.CountOnlineResponse{Sessions: rep.SessionsOnline, Users: rep.UsersOnline}
	if req.Room == "" {
		return out, nil
	}
	_, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	reps, err := a.askNodes(ctx, roomNodes(info, ""), &buspb.NodeControl{
		Op: buspb.NodeControl_OP_COUNT_TAGS, App: app, Room: req.Room, TagExprs: req.TagExprs, TagPrefix: req.TagPrefix,
	})
	if err != nil {
		return nil, err
	}
	exprCounts := make([]int64, len(req.TagExprs))
	tagCounts := make(map[string]int64)
	for _, r := range reps {
		if len(r.ExprCounts) != len(exprCounts) {
			return nil, a.internal("count by tags", fmt.Errorf("a node answered %d counts for %d expressions", len(r.ExprCounts), len(exprCounts)))
		}
		out.RoomOnline += r.Affected
		for i, n := range r.ExprCounts {
			exprCounts[i] += n
		}
		for t, n := range r.TagCounts {
			tagCounts[t] += n
		}
		if r.More || len(tagCounts) > maxTagCounts {
			return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "more than %d distinct tags start with %q in room %q: give a longer tag_prefix", maxTagCounts, req.TagPrefix, req.Room)
		}
	}
	out.ExprCounts = make([]*apipb.TagCount, len(req.TagExprs))
	for i, src := range req.TagExprs {
		out.ExprCounts[i] = &apipb.TagCount{TagExpr: src, Online: exprCounts[i]}
	}
	out.TagCounts = make([]*apipb.TagCount, 0, len(tagCounts))
	for t, n := range tagCounts {
		out.TagCounts = append(out.TagCounts, &apipb.TagCount{Tag: t, Online: n})
	}
	slices.SortFunc(out.TagCounts, func(x, y *apipb.TagCount) int { return strings.Compare(x.Tag, y.Tag) })
	return out, nil
}

// checkCountRequest refuses what a CountOnline request may not ask.
func (a *API) checkCountRequest(req *apipb.CountOnlineRequest) error {
	switch {
	case req.Room == "" && (len(req.TagExprs) > 0 || req.TagPrefix != ""):
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tag_exprs and tag_prefix count a room's members: give room")
	case len(req.TagExprs) > maxCountExprs:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%d tag_exprs, the limit is %d", len(req.TagExprs), maxCountExprs)
	case req.TagPrefix != "" && tag.Validate([]string{req.TagPrefix}) != nil:
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tag_prefix %q is not the start of a valid tag", req.TagPrefix)
	}
	for i, src := range req.TagExprs {
		if err := a.checkTagExpr(fmt.Sprintf("tag_exprs[%d]", i), src); err != nil {
			return err
		}
	}
	return nil
}
