package roomqueue

import (
	"fmt"
	"slices"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// EventType is the message type of a queue change broadcast to the room (critical lane, body a
// QueueEvent).
const EventType = "rc.queue"

// MaxKeyBytes bounds an entry's key.
const MaxKeyBytes = 64

// refusal is a request the queue refuses, with the code the requester is told.
type refusal struct {
	code clientpb.ErrorCode
	msg  string
}

func (r *refusal) Error() string { return r.msg }

func refuse(code clientpb.ErrorCode, format string, args ...any) *refusal {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...)}
}

// caller is who asks: the app server, or a member through its ChatLink.
type caller struct {
	member  bool   // false: the app server, which may do anything
	uid     string // the member's
	session string // the member's
	// For a member: the room's queue_expr allows it to change the queue, queue_admin_expr to
	// change other members' entries.
	mayChange, admin bool
}

// mayTake reports whether who may take e out of the queue, or replace its value.
func (who caller) mayTake(e *clientpb.QueueEntry) bool {
	return !who.member || who.admin || (who.mayChange && e.Uid == who.uid)
}

// validKey reports whether k is 1 to MaxKeyBytes of A-Z a-z 0-9 _ - . :
func validKey(k string) bool {
	if k == "" || len(k) > MaxKeyBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// find returns the index of the entry with key (the head for an empty key), or -1.
func find(st *clientpb.QueueState, key string) int {
	if key == "" {
		if len(st.Entries) == 0 {
			return -1
		}
		return 0
	}
	return slices.IndexFunc(st.Entries, func(e *clientpb.QueueEntry) bool { return e.Key == key })
}

func notFound(key string) *refusal {
	if key == "" {
		return refuse(clientpb.ErrorCode_ERROR_CODE_QUEUE_NOT_FOUND, "the queue is empty")
	}
	return refuse(clientpb.ErrorCode_ERROR_CODE_QUEUE_NOT_FOUND, "no entry with key %q", key)
}

// removed describes entries taken out, for an event: without their values, so an event stays
// small whatever the queue holds.
func removed(entries []*clientpb.QueueEntry) []*clientpb.QueueEntry {
	out := make([]*clientpb.QueueEntry, len(entries))
	for i, e := range entries {
		out[i] = &clientpb.QueueEntry{Key: e.Key, Uid: e.Uid, SessionId: e.SessionId, TimeMs: e.TimeMs, DropOnLeave: e.DropOnLeave}
	}
	return out
}

// change applies a change (offer, poll, remove, clear) to st. It returns the entries the
// requester is answered with and the event to broadcast, or a refusal. st is left as it was
// when it refuses. req has passed Service.check (an offer or a remove names a valid key).
func change(st *clientpb.QueueState, op clientpb.QueueOp, req *roompb.QueueRequest, who caller, maxEntries int, now time.Time) ([]*clientpb.QueueEntry, *clientpb.QueueEvent, error) {
	if who.member && !who.mayChange {
		return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, "you may not change this room's queue")
	}
	switch op {
	case clientpb.QueueOp_QUEUE_OP_OFFER:
		e := &clientpb.QueueEntry{Key: req.Key, Value: req.Value, Uid: req.Uid, SessionId: req.SessionId, TimeMs: now.UnixMilli(), DropOnLeave: req.DropOnLeave}
		i := find(st, req.Key)
		switch {
		case i >= 0 && req.IfAbsent:
			return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_QUEUE_KEY_EXISTS, "key %q is taken", req.Key)
		case i >= 0 && !who.mayTake(st.Entries[i]):
			return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_QUEUE_KEY_EXISTS, "key %q is another member's", req.Key)
		case i >= 0:
			st.Entries[i] = e
		case len(st.Entries) >= maxEntries:
			return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_QUEUE_FULL, "the queue holds %d entries, its limit", len(st.Entries))
		default:
			st.Entries = append(st.Entries, e)
		}
		return []*clientpb.QueueEntry{e}, &clientpb.QueueEvent{Op: op, Entries: []*clientpb.QueueEntry{e}}, nil
	case clientpb.QueueOp_QUEUE_OP_POLL, clientpb.QueueOp_QUEUE_OP_REMOVE:
		i := find(st, req.Key)
		if i < 0 {
			return nil, nil, notFound(req.Key)
		}
		e := st.Entries[i]
		if !who.mayTake(e) {
			return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, "entry %q is another member's", e.Key)
		}
		st.Entries = slices.Delete(st.Entries, i, i+1)
		return []*clientpb.QueueEntry{e}, &clientpb.QueueEvent{Op: op, Entries: removed([]*clientpb.QueueEntry{e})}, nil
	case clientpb.QueueOp_QUEUE_OP_CLEAR:
		if who.member && !who.admin {
			return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, "you may not clear this room's queue")
		}
		gone := st.Entries
		st.Entries = nil
		return gone, &clientpb.QueueEvent{Op: op, Entries: removed(gone)}, nil
	}
	return nil, nil, refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown queue op %d", op)
}

// drop takes the drop_on_leave entries of sessions out of st. It returns the event, or nil when
// st holds none.
func drop(st *clientpb.QueueState, sessions map[string]bool) *clientpb.QueueEvent {
	var gone []*clientpb.QueueEntry
	st.Entries = slices.DeleteFunc(st.Entries, func(e *clientpb.QueueEntry) bool {
		if e.DropOnLeave && sessions[e.SessionId] {
			gone = append(gone, e)
			return true
		}
		return false
	})
	if len(gone) == 0 {
		return nil
	}
	return &clientpb.QueueEvent{Op: clientpb.QueueOp_QUEUE_OP_DROP, Entries: removed(gone)}
}
