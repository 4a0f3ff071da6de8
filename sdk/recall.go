package sdk

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"roomcast/proto/clientpb"
)

// Recall (docs/protocol.md, "Recall"): the app server, a member within the room's window, or a
// moderator of the room (RecallAsModerator) recalls a message. Every member gets a Recall frame; the Client drops the message from what
// it has not handed over yet (its queue, a held recovery, the CDN play-out heap), remembers its
// id among the ids seen so that a later copy (a recovery, a CDN segment) is dropped as a
// duplicate, and hands the app a RecalledEvent to remove it from what it shows.

// RecalledEvent: a message of the room was recalled. Remove it from what you show; the Client
// will not hand it to OnMessage from now on (nor did it after the recall reached it). It comes
// once per message, also for a message this Client never handed over.
type RecalledEvent struct {
	// ID is the recalled message's id.
	ID string
	// At is when it was recalled (server time).
	At time.Time
	// ByUID is the member who recalled it (its sender, or a moderator of the room); empty when
	// the app server did.
	ByUID string
}

func (*RecalledEvent) event() {}

// Recall errors to match with errors.Is; Recall returns them as a *SendError.
var (
	// ErrMessageNotFound: the room's history does not hold the message (not sent to this room,
	// no longer kept, or a bulk message, which members cannot recall).
	ErrMessageNotFound = &SendError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND)}
	// ErrRecallNotAllowed: the room does not let members recall their messages, or the
	// message is not this member's.
	ErrRecallNotAllowed = &SendError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_RECALL_NOT_ALLOWED)}
	// ErrRecallWindowPassed: the message is older than the room lets members recall.
	ErrRecallWindowPassed = &SendError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_RECALL_WINDOW_PASSED)}
)

// Recall recalls a message this member sent (its id, as Send returned it), if the room allows
// members to (its sender_recall_window_s) and the message is young enough. already is true
// when it had been recalled before. Refusals are *SendError values (ErrMessageNotFound,
// ErrRecallNotAllowed, ErrRecallWindowPassed).
func (c *Client) Recall(ctx context.Context, messageID string) (already bool, err error) {
	return onConn(c, ctx, "recall", func(cur *conn) (bool, error) {
		r := cur.request(ctx, "recall", func(seq uint64) *clientpb.Frame {
			return &clientpb.Frame{Kind: &clientpb.Frame_RecallRequest{RecallRequest: &clientpb.RecallRequest{Seq: seq, MessageId: messageID}}}
		})
		switch {
		case r.err != nil:
			return false, r.err
		case r.recall.GetCode() != 0:
			return false, &SendError{Code: r.recall.GetCode(), Message: r.recall.GetMessage()}
		}
		return r.recall.GetAlreadyRecalled(), nil
	})
}

// recallMark is the key under which a recall is remembered among the ids seen: apart from the
// message's own id, which marks the message as had.
const recallMark = "recall:"

// recall takes a Recall frame.
func (d *delivery) recall(rc *clientpb.Recall) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	gone := make(map[string]bool)
	for _, m := range rc.GetMessages() {
		id := m.GetId()
		if id == "" || !d.rememberLocked(recallMark+id) {
			continue // told before (a recall sent again)
		}
		gone[id] = true
		d.rememberLocked(id) // a copy that comes later is a duplicate
		d.enqueueLocked(item{ev: &RecalledEvent{ID: id, At: time.UnixMilli(m.GetRecalledMs()), ByUID: m.GetByUid()}})
	}
	if len(gone) == 0 {
		return
	}
	isGone := func(m *clientpb.Message) bool { return m != nil && gone[m.GetId()] }
	// Not yet handed over: dropped. The RecalledEvents queued above stay.
	before := len(d.queue)
	d.queue = slices.DeleteFunc(d.queue, func(it item) bool { return isGone(it.msg) })
	d.queued -= before - len(d.queue)
	if h := d.hold; h != nil {
		h.msgs = slices.DeleteFunc(h.msgs, isGone)
	}
	if n := len(d.held); n > 0 {
		d.held = slices.DeleteFunc(d.held, isGone)
		if len(d.held) != n {
			heap.Init(&d.held)
		}
	}
}
