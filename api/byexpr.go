package api

import (
	"context"
	"slices"
	"sync"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// What the calls by tag expression share (kick, mute, list and count by tags): the check of an
// expression, and asking every node that holds a room at once.

// maxCountExprs bounds the tag expressions one CountOnline counts.
const maxCountExprs = 32

// checkTagExpr refuses a tag expression outside the language of docs/tags.md with
// BAD_TAG_EXPR, naming the field.
func (a *API) checkTagExpr(field, src string) error {
	if _, err := a.exprs.Get(src); err != nil {
		return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR, "%s: %v", field, err)
	}
	return nil
}

// roomNodes returns the nodes that hold members of a room, as the room service knows them from
// the nodes' reports, in name order, from the node named from on (all for "").
func roomNodes(info *buspb.RoomInfo, from string) []string {
	nodes := make([]string, 0, len(info.Nodes))
	for n := range info.Nodes {
		if n >= from {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// askNodes sends req to every node at once and returns their answers, in the order of nodes. A
// node that answers with an error, or not in time, fails the call with that error: a node that
// cannot be asked is never taken for one with nothing to report.
func (a *API) askNodes(ctx context.Context, nodes []string, req *buspb.NodeControl) ([]*buspb.NodeControlReply, error) {
	reps := make([]*buspb.NodeControlReply, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() {
			reps[i] = new(buspb.NodeControlReply)
			errs[i] = a.ask(ctx, bus.NodeSubject(node), req, reps[i])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return reps, nil
}
