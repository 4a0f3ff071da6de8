package sdk

import (
	"context"
	"fmt"

	"roomcast/proto/clientpb"
)

// HistoryQuery asks Client.History for a page of the room's kept history: its critical and
// normal messages that this member may see. Give at most one of BeforeID, AfterID and Cursor;
// none asks for the newest messages. docs/protocol.md describes paging.
type HistoryQuery struct {
	// Limit is the most messages the page holds. Zero value means 50; the server caps it at 200.
	Limit int
	// BeforeID asks for the messages older than this message id.
	BeforeID string
	// AfterID asks for the messages newer than this message id.
	AfterID string
	// Cursor asks for the next page: a HistoryPage.NextCursor, as it came.
	Cursor string
	// Lane is LANE_CRITICAL or LANE_NORMAL for only that lane. Zero value means both.
	Lane clientpb.Lane
}

func (q HistoryQuery) frame(seq uint64) *clientpb.HistoryQuery {
	return &clientpb.HistoryQuery{
		Seq: seq, Limit: uint32(max(0, q.Limit)), BeforeId: q.BeforeID, AfterId: q.AfterID, Cursor: q.Cursor, Lane: q.Lane,
	}
}

// History asks the server for a page of the room's history and waits for it. The page's
// messages come oldest first; its NextCursor, given as the next query's Cursor, continues in
// the same direction (older for the newest messages and BeforeID; newer for AfterID) and is
// empty when the room keeps nothing more that way. A refusal is a *HistoryError. While the
// Client reconnects, History waits for the next connection. The messages are not handed to
// OnMessage: they are the caller's.
func (c *Client) History(ctx context.Context, q HistoryQuery) (*clientpb.HistoryPage, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("roomcast: history: %w", err)
	}
	return onConn(c, ctx, "history", func(cur *conn) (*clientpb.HistoryPage, error) { return cur.queryHistory(ctx, q) })
}

// HistoryError is a history query the server refused with an Error frame (docs/protocol.md):
// BAD_HISTORY_QUERY (110), HISTORY_BUSY (111, too many of this connection's queries wait; retry
// after one answers) or UNAVAILABLE (503). The connection stays open.
type HistoryError struct {
	// Code is a clientpb.ErrorCode.
	Code uint32
	// Message is the server's explanation.
	Message string
}

// Error implements error.
func (e *HistoryError) Error() string {
	return fmt.Sprintf("roomcast: history query refused: code %d (%s): %s",
		e.Code, clientpb.ErrorCode(e.Code).String(), e.Message)
}

// Temporary reports whether the same query may succeed later (5xx codes and HISTORY_BUSY).
func (e *HistoryError) Temporary() bool {
	return e.Code >= 500 || e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_HISTORY_BUSY)
}
