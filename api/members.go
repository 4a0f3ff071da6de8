package api

import (
	"context"
	"encoding/base64"
	"strings"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// Member listing: a room's members are asked of the ChatLinks that hold it, a page at a time.

// pageToken is where a member list goes on: a node, and the last session listed there.
func pageToken(node, after string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(node + "\n" + after))
}

func parsePageToken(tok string) (node, after string, err error) {
	if tok == "" {
		return "", "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil {
		var ok bool
		if node, after, ok = strings.Cut(string(b), "\n"); ok && auth.ValidName(node) {
			return node, after, nil
		}
	}
	return "", "", apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "page_token is not one this API handed out")
}

// ListMembers implements RoomcastAPI. It walks the nodes that hold the room in name order and
// asks each for a page of its members (with the tag, and satisfying the tag expression, when
// given) in session id order; the page token says where to go on.
func (a *API) ListMembers(ctx context.Context, req *apipb.ListMembersRequest) (*apipb.ListMembersResponse, error) {
	app := appOf(ctx)
	size := int(req.PageSize)
	switch {
	case size == 0:
		size = defaultPageSize
	case size < 0 || size > maxPageSize:
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "page_size must be 0 to %d", maxPageSize)
	case len(req.Tag) > 128:
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tag is longer than 128 bytes")
	}
	if req.TagExpr != "" {
		if err := a.checkTagExpr("tag_expr", req.TagExpr); err != nil {
			return nil, err
		}
	}
	fromNode, after, err := parsePageToken(req.PageToken)
	if err != nil {
		return nil, err
	}
	_, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	nodes := roomNodes(info, fromNode)
	out := &apipb.ListMembersResponse{Members: []*apipb.RoomMember{}}
	for i, node := range nodes {
		from := ""
		if node == fromNode {
			from = after
		}
		var rep buspb.NodeControlReply
		if err := a.ask(ctx, bus.NodeSubject(node), &buspb.NodeControl{
			Op: buspb.NodeControl_OP_MEMBERS, App: app, Room: req.Room, Tag: req.Tag, TagExpr: req.TagExpr, After: from, Limit: int32(size - len(out.Members)),
		}, &rep); err != nil {
			return nil, err
		}
		for _, m := range rep.Members {
			out.Members = append(out.Members, &apipb.RoomMember{Uid: m.Uid, SessionId: m.SessionId, Node: m.Node, Device: m.Device, Tags: m.Tags, LoginTimeMs: m.LoginTimeMs})
		}
		if len(out.Members) >= size {
			switch {
			case rep.More && len(rep.Members) > 0:
				out.NextPageToken = pageToken(node, rep.Members[len(rep.Members)-1].SessionId)
			case i+1 < len(nodes):
				out.NextPageToken = pageToken(nodes[i+1], "")
			}
			break
		}
	}
	return out, nil
}
