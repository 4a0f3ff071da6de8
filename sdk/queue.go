package sdk

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// The room queue (docs/protocol.md, "Room queue"): each room's ordered list of key/value
// entries. The Client's methods read and change it; every change reaches every member as a
// message of type QueueEventType (QueueEventOf decodes it), and a QueueView keeps a copy in
// step with those events.

// QueueEventType is the message type of a room queue change.
const QueueEventType = "rc.queue"

// QueueError is the server's refusal of a queue request: the connection stays up.
type QueueError struct {
	// Code is a clientpb.ErrorCode: 114 QUEUE_KEY_EXISTS, 115 QUEUE_NOT_FOUND, 116
	// QUEUE_FULL, 100 BAD_REQUEST, 101 MESSAGE_TOO_LARGE, 103 FORBIDDEN, 503 UNAVAILABLE.
	Code uint32
	// Message is the server's explanation.
	Message string
}

// Error implements error.
func (e *QueueError) Error() string {
	return fmt.Sprintf("roomcast: queue request refused: code %d (%s): %s",
		e.Code, clientpb.ErrorCode(e.Code).String(), e.Message)
}

// Is lets errors.Is match a QueueError by code: errors.Is(err, &QueueError{Code: 114}).
func (e *QueueError) Is(target error) bool {
	t, ok := target.(*QueueError)
	return ok && t.Code == e.Code
}

// Queue errors to match with errors.Is.
var (
	// ErrQueueKeyExists: an offer with IfAbsent found its key taken (someone else grabbed
	// it), or the key is another member's.
	ErrQueueKeyExists = &QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_QUEUE_KEY_EXISTS)}
	// ErrQueueNotFound: no entry with that key, or the queue is empty.
	ErrQueueNotFound = &QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_QUEUE_NOT_FOUND)}
	// ErrQueueFull: the queue holds as many entries as the room allows.
	ErrQueueFull = &QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_QUEUE_FULL)}
)

// OfferOptions are the choices of an offer.
type OfferOptions struct {
	// IfAbsent fails the offer with ErrQueueKeyExists when the key is in the queue, instead of
	// replacing its value: of several members offering one key at once, exactly one succeeds.
	IfAbsent bool
	// DropOnLeave takes the entry out of the queue when this connection's session ends (the
	// member leaves, is kicked, or its ChatLink dies). A reconnect is a new session.
	DropOnLeave bool
}

// queue sends a queue request on the current connection and waits for its answer.
func (c *Client) queue(ctx context.Context, req *clientpb.RoomQueueRequest) (*clientpb.RoomQueueReply, error) {
	what := "queue " + req.Op.String()
	return onConn(c, ctx, what, func(cur *conn) (*clientpb.RoomQueueReply, error) {
		r := cur.request(ctx, what, func(seq uint64) *clientpb.Frame {
			req.Seq = seq
			return &clientpb.Frame{Kind: &clientpb.Frame_QueueRequest{QueueRequest: req}}
		})
		switch {
		case r.err != nil:
			return nil, r.err
		case r.queue.GetCode() != 0:
			return nil, &QueueError{Code: r.queue.GetCode(), Message: r.queue.GetMessage()}
		}
		return r.queue, nil
	})
}

// first returns the one entry an answer carries.
func first(rep *clientpb.RoomQueueReply, err error) (*clientpb.QueueEntry, error) {
	if err != nil {
		return nil, err
	}
	if len(rep.Entries) == 0 {
		return nil, fmt.Errorf("%w: a queue answer without its entry", ErrProtocol)
	}
	return rep.Entries[0], nil
}

// QueueOffer adds an entry with key and value at the tail of the room's queue, or replaces the
// value of the entry with key (in place) when it is this member's. It returns the entry as
// stored.
func (c *Client) QueueOffer(ctx context.Context, key string, value []byte, opts OfferOptions) (*clientpb.QueueEntry, error) {
	return first(c.queue(ctx, &clientpb.RoomQueueRequest{
		Op: clientpb.QueueOp_QUEUE_OP_OFFER, Key: key, Value: value, IfAbsent: opts.IfAbsent, DropOnLeave: opts.DropOnLeave,
	}))
}

// QueuePoll takes the entry with key (the head, for "") out of the queue and returns it.
func (c *Client) QueuePoll(ctx context.Context, key string) (*clientpb.QueueEntry, error) {
	return first(c.queue(ctx, &clientpb.RoomQueueRequest{Op: clientpb.QueueOp_QUEUE_OP_POLL, Key: key}))
}

// QueuePeek returns the entry with key (the head, for "") without taking it.
func (c *Client) QueuePeek(ctx context.Context, key string) (*clientpb.QueueEntry, error) {
	return first(c.queue(ctx, &clientpb.RoomQueueRequest{Op: clientpb.QueueOp_QUEUE_OP_PEEK, Key: key}))
}

// QueueRemove takes the entry with key out of the queue and returns it.
func (c *Client) QueueRemove(ctx context.Context, key string) (*clientpb.QueueEntry, error) {
	return first(c.queue(ctx, &clientpb.RoomQueueRequest{Op: clientpb.QueueOp_QUEUE_OP_REMOVE, Key: key}))
}

// QueueList returns every entry of the queue, head first, and the queue's version.
func (c *Client) QueueList(ctx context.Context) ([]*clientpb.QueueEntry, uint64, error) {
	rep, err := c.queue(ctx, &clientpb.RoomQueueRequest{Op: clientpb.QueueOp_QUEUE_OP_LIST})
	if err != nil {
		return nil, 0, err
	}
	return rep.Entries, rep.Version, nil
}

// QueueClear empties the queue and returns the entries it took out.
func (c *Client) QueueClear(ctx context.Context) ([]*clientpb.QueueEntry, error) {
	rep, err := c.queue(ctx, &clientpb.RoomQueueRequest{Op: clientpb.QueueOp_QUEUE_OP_CLEAR})
	if err != nil {
		return nil, err
	}
	return rep.Entries, nil
}

// QueueEventOf returns the queue change m carries, if it is one: a critical message of type
// QueueEventType from the server (members cannot send that type).
func QueueEventOf(m *clientpb.Message) (*clientpb.QueueEvent, bool) {
	if m.GetType() != QueueEventType || m.GetSender() != "" || m.GetLane() != clientpb.Lane_LANE_CRITICAL {
		return nil, false
	}
	var ev clientpb.QueueEvent
	if proto.Unmarshal(m.Body, &ev) != nil || ev.Version == 0 {
		return nil, false
	}
	return &ev, true
}

// QueueView is a copy of a room's queue kept in step with its change events: Reset it with a
// QueueList, then Apply every event. Events are applied in version order whatever order they
// come in; one that arrives before its predecessor waits for it. It is not safe for concurrent
// use.
type QueueView struct {
	version uint64
	entries []*clientpb.QueueEntry
	early   map[uint64]*clientpb.QueueEvent // events that came before their predecessor
}

// Reset replaces the view with a listing (QueueList) and drops the waiting events it covers.
func (v *QueueView) Reset(entries []*clientpb.QueueEntry, version uint64) {
	v.entries, v.version = slices.Clone(entries), version
	for ver := range v.early {
		if ver <= version {
			delete(v.early, ver)
		}
	}
	v.drain()
}

// Apply takes in one change. It reports whether the view is behind: events are missing
// (Waiting > 0) and, if they do not come soon, the caller should Reset from a QueueList.
func (v *QueueView) Apply(ev *clientpb.QueueEvent) (behind bool) {
	if ev.Version > v.version {
		if v.early == nil {
			v.early = make(map[uint64]*clientpb.QueueEvent)
		}
		v.early[ev.Version] = ev
		v.drain()
	}
	return len(v.early) > 0
}

// drain applies the waiting events that follow the view's version.
func (v *QueueView) drain() {
	for {
		ev, ok := v.early[v.version+1]
		if !ok {
			return
		}
		delete(v.early, ev.Version)
		v.apply(ev)
		v.version = ev.Version
	}
}

func (v *QueueView) apply(ev *clientpb.QueueEvent) {
	indexOf := func(key string) int {
		return slices.IndexFunc(v.entries, func(e *clientpb.QueueEntry) bool { return e.Key == key })
	}
	switch ev.Op {
	case clientpb.QueueOp_QUEUE_OP_OFFER:
		for _, e := range ev.Entries {
			if i := indexOf(e.Key); i >= 0 {
				v.entries[i] = e
			} else {
				v.entries = append(v.entries, e)
			}
		}
	case clientpb.QueueOp_QUEUE_OP_CLEAR:
		v.entries = nil
	default: // poll, remove, drop
		for _, e := range ev.Entries {
			if i := indexOf(e.Key); i >= 0 {
				v.entries = slices.Delete(v.entries, i, i+1)
			}
		}
	}
}

// Entries returns the view's entries, head first. The slice is the view's: do not change it.
func (v *QueueView) Entries() []*clientpb.QueueEntry { return v.entries }

// Version returns the version of the queue the view shows.
func (v *QueueView) Version() uint64 { return v.version }

// Waiting returns how many events wait for a missing predecessor.
func (v *QueueView) Waiting() int { return len(v.early) }
