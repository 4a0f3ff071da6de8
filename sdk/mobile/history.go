package mobile

import (
	"context"
	"errors"

	"roomcast/sdk"
)

// HistoryQuery asks Client.History for a page of the room's kept history: its critical and
// normal messages this member may see. Give at most one of BeforeID, AfterID and Cursor; none
// asks for the newest messages (docs/protocol.md, history).
type HistoryQuery struct {
	// Limit is the most messages the page holds. Zero value means 50; the server caps it at 200.
	Limit int
	// BeforeID asks for the messages older than this message id.
	BeforeID string
	// AfterID asks for the messages newer than this message id.
	AfterID string
	// Cursor asks for the next page: a HistoryPage.NextCursor, as it came.
	Cursor string
	// Lane is LaneCritical or LaneNormal for only that lane. Zero value means both.
	Lane string
}

// HistoryPage is a page of the room's history, oldest first, or the server's refusal of the
// query (ErrorCode not 0: 110 BAD_HISTORY_QUERY, 111 HISTORY_BUSY, 503 UNAVAILABLE).
type HistoryPage struct {
	msgs []*Message
	// NextCursor, given as the next query's Cursor, continues in the same direction (older for
	// the newest messages and BeforeID, newer for AfterID); empty when the room keeps nothing
	// more that way.
	NextCursor string
	// ErrorCode is 0 for a page, else why the server refused the query (docs/protocol.md §4).
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
	// Temporary reports whether a refused query may succeed later (111, 5xx).
	Temporary bool
}

// Len returns how many messages the page holds.
func (p *HistoryPage) Len() int { return len(p.msgs) }

// Get returns the page's i-th message (0 <= i < Len), oldest first.
func (p *HistoryPage) Get(i int) *Message { return p.msgs[i] }

// History asks the server for a page of the room's history and waits for it, at most
// Config.SendTimeoutMs (waiting for the next connection while the Client reconnects). The
// page's messages are not handed to Listener.OnMessage: they are the caller's. A refusal is a
// page with its ErrorCode; the error is for no answer (closed, timed out) or a bad query.
func (c *Client) History(q *HistoryQuery) (*HistoryPage, error) {
	if q == nil {
		q = &HistoryQuery{}
	}
	sq := sdk.HistoryQuery{Limit: q.Limit, BeforeID: q.BeforeID, AfterID: q.AfterID, Cursor: q.Cursor}
	if q.Lane != "" {
		lane, err := parseLane(q.Lane)
		if err != nil {
			return nil, err
		}
		sq.Lane = lane
	}
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	page, err := c.c.History(ctx, sq)
	if he := (*sdk.HistoryError)(nil); errors.As(err, &he) {
		return &HistoryPage{ErrorCode: int32(he.Code), ErrorMessage: he.Message, Temporary: he.Temporary()}, nil
	}
	if err != nil {
		return nil, err
	}
	out := &HistoryPage{NextCursor: page.GetNextCursor()}
	for _, m := range page.GetMessages() {
		out.msgs = append(out.msgs, newMessage(m))
	}
	return out, nil
}
