package mobile

import (
	"context"
	"errors"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// The room queue (docs/protocol.md, "Room queue"): each room's ordered list of key/value
// entries, e.g. the members who raised a hand. Every change reaches every member as a message
// of type QueueEventType, which QueueEventOf decodes.

// QueueEventType is the Message.Type of a room queue change (sent by the server, critical).
const QueueEventType = sdk.QueueEventType

// Queue operations, for QueueChange.Op.
const (
	QueueOpOffer  = "offer"
	QueueOpPoll   = "poll"
	QueueOpRemove = "remove"
	QueueOpClear  = "clear"
	QueueOpDrop   = "drop" // the owner's session ended (an entry offered with DropOnLeave)
)

// QueueEntry is an entry of a room's queue.
type QueueEntry struct {
	// Key is unique in the queue: 1 to 64 bytes of A-Z a-z 0-9 _ - . :
	Key string
	// Value is opaque to Roomcast; at most 1,024 bytes by default.
	Value []byte
	// UID is the member that offered it; empty when the app server did without a uid.
	UID string
	// SessionID is the owner's session, when it offered the entry from a client.
	SessionID string
	// TimeMs is the server time of the offer (of the last replacement), Unix milliseconds.
	TimeMs int64
	// DropOnLeave: the entry leaves the queue when SessionID's session ends.
	DropOnLeave bool
}

// QueueEntries are entries of a room's queue, head first.
type QueueEntries struct {
	entries []*QueueEntry
}

// Len returns how many entries there are.
func (q *QueueEntries) Len() int { return len(q.entries) }

// Get returns the i-th entry (0 <= i < Len), head first.
func (q *QueueEntries) Get(i int) *QueueEntry { return q.entries[i] }

func newQueueEntries(list []*clientpb.QueueEntry) *QueueEntries {
	out := &QueueEntries{}
	for _, e := range list {
		out.entries = append(out.entries, newQueueEntry(e))
	}
	return out
}

func newQueueEntry(e *clientpb.QueueEntry) *QueueEntry {
	return &QueueEntry{Key: e.GetKey(), Value: e.GetValue(), UID: e.GetUid(), SessionID: e.GetSessionId(), TimeMs: e.GetTimeMs(), DropOnLeave: e.GetDropOnLeave()}
}

// QueueResult is the server's answer to a queue request: the entries it names and the queue's
// version, or a refusal with its code (the connection stays up).
type QueueResult struct {
	// Entries: for an offer, the entry as stored; poll, peek, remove: the entry; list: every
	// entry, head first; clear: the entries taken out. Empty with a refusal.
	Entries *QueueEntries
	// Version is the queue's version after a QueueList; 0 after the other requests.
	Version int64
	// ErrorCode is 0 when the request succeeded, else why it was refused: ErrorQueueKeyExists,
	// ErrorQueueNotFound, ErrorQueueFull, or 100, 101, 103, 503 (docs/protocol.md §4).
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
}

// Entry returns the first entry of the result (the one an offer, poll, peek or remove names);
// nil if there is none.
func (r *QueueResult) Entry() *QueueEntry {
	if r.Entries == nil || r.Entries.Len() == 0 {
		return nil
	}
	return r.Entries.Get(0)
}

// queue runs one request of the Go SDK's and converts its answer: a QueueError is a result.
func (c *Client) queue(do func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error)) (*QueueResult, error) {
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	entries, version, err := do(ctx)
	if qe := (*sdk.QueueError)(nil); errors.As(err, &qe) {
		return &QueueResult{Entries: &QueueEntries{}, ErrorCode: int32(qe.Code), ErrorMessage: qe.Message}, nil
	}
	if err != nil {
		return nil, err
	}
	return &QueueResult{Entries: newQueueEntries(entries), Version: toInt64(version)}, nil
}

func one(e *clientpb.QueueEntry, err error) ([]*clientpb.QueueEntry, uint64, error) {
	if err != nil {
		return nil, 0, err
	}
	return []*clientpb.QueueEntry{e}, 0, nil
}

// QueueOffer adds an entry with key and value at the tail of the room's queue, or replaces the
// value of the entry with key (in place) when it is this member's. With ifAbsent, an offer
// whose key is in the queue is refused (ErrorQueueKeyExists) rather than replacing it: of
// several members offering one key at once, one succeeds. With dropOnLeave, the entry leaves
// the queue when this connection's session ends (a reconnect is a new session). Each queue
// call waits for the server's answer, at most Config.SendTimeoutMs; a refusal is a result,
// the error is for no answer.
func (c *Client) QueueOffer(key string, value []byte, ifAbsent, dropOnLeave bool) (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) {
		return one(c.c.QueueOffer(ctx, key, value, sdk.OfferOptions{IfAbsent: ifAbsent, DropOnLeave: dropOnLeave}))
	})
}

// QueuePoll takes the entry with key (the head, for "") out of the queue.
func (c *Client) QueuePoll(key string) (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) { return one(c.c.QueuePoll(ctx, key)) })
}

// QueuePeek returns the entry with key (the head, for "") without taking it.
func (c *Client) QueuePeek(key string) (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) { return one(c.c.QueuePeek(ctx, key)) })
}

// QueueRemove takes the entry with key out of the queue.
func (c *Client) QueueRemove(key string) (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) {
		return one(c.c.QueueRemove(ctx, key))
	})
}

// QueueList returns every entry of the queue, head first, and its version.
func (c *Client) QueueList() (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) { return c.c.QueueList(ctx) })
}

// QueueClear empties the queue and returns the entries it took out.
func (c *Client) QueueClear() (*QueueResult, error) {
	return c.queue(func(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) {
		entries, err := c.c.QueueClear(ctx)
		return entries, 0, err
	})
}

// QueueChange is a change of the room's queue, as a message of type QueueEventType carries it.
type QueueChange struct {
	// Op is QueueOpOffer, QueueOpPoll, QueueOpRemove, QueueOpClear or QueueOpDrop.
	Op string
	// Version is the queue's version after the change: changes apply in version order.
	Version int64
	// Entries: for an offer, the entry added or replaced; poll, remove, drop: the entries taken
	// out (Key, UID and SessionID only); clear: the keys taken out.
	Entries *QueueEntries
}

// QueueEventOf returns the queue change m carries, or nil if m is not one (a message of type
// QueueEventType from the server; members cannot send that type).
func QueueEventOf(m *Message) *QueueChange {
	if m == nil {
		return nil
	}
	lane, _ := parseLane(m.Lane)
	ev, ok := sdk.QueueEventOf(&clientpb.Message{Type: m.Type, Sender: m.Sender, Lane: lane, Body: m.Body})
	if !ok {
		return nil
	}
	op := ""
	switch ev.Op {
	case clientpb.QueueOp_QUEUE_OP_OFFER:
		op = QueueOpOffer
	case clientpb.QueueOp_QUEUE_OP_POLL:
		op = QueueOpPoll
	case clientpb.QueueOp_QUEUE_OP_REMOVE:
		op = QueueOpRemove
	case clientpb.QueueOp_QUEUE_OP_CLEAR:
		op = QueueOpClear
	case clientpb.QueueOp_QUEUE_OP_DROP:
		op = QueueOpDrop
	}
	return &QueueChange{Op: op, Version: toInt64(ev.Version), Entries: newQueueEntries(ev.Entries)}
}
