package chatlink

import (
	"context"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// maxHistoryQueries bounds the history queries of one connection waiting for the room service:
// each reads the room's history from JetStream, so a client may not pile them up.
const maxHistoryQueries = 2

// queryHistory answers a client's HistoryQuery: the room service pages the room's history as
// this member may see it (its uid and tags now), and the answer goes back with the query's seq.
func (c *conn) queryHistory(q *clientpb.HistoryQuery) {
	c.mu.Lock()
	busy := c.historyQ >= maxHistoryQueries
	if !busy {
		c.historyQ++
	}
	c.mu.Unlock()
	if busy {
		c.sendError(q.Seq, clientpb.ErrorCode_ERROR_CODE_HISTORY_BUSY, "too many history queries waiting for an answer")
		return
	}
	n := c.node
	n.goAsync(func() {
		defer func() {
			c.mu.Lock()
			c.historyQ--
			c.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
		defer cancel()
		var rep buspb.Reply
		err := n.request(ctx, busHistory, bus.SubjectRoomHistory, &buspb.HistoryRequest{
			App: c.app, Room: c.room, Query: q, AsMember: true, Uid: c.uid, Tags: c.tagList(),
		}, &rep)
		switch {
		case err != nil:
			c.sendError(q.Seq, clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, "room service did not answer")
		case rep.Code != 0:
			c.sendError(q.Seq, clientpb.ErrorCode(rep.Code), rep.Message)
		default:
			page := rep.History
			if page == nil {
				page = &clientpb.HistoryPage{}
			}
			page.Seq = q.Seq
			c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_HistoryPage{HistoryPage: page}})
		}
	})
}
