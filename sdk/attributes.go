package sdk

import (
	"context"
	"fmt"
	"maps"
	"time"

	"roomcast/proto/clientpb"
)

// Room attributes (docs/protocol.md, "Room attributes"): a room's small key/value set set by the
// app server (an announcement, a pinned message, app data), received after the login and again,
// whole, whenever it changes. Members the room permits (its attributes_expr and attribute_keys)
// set and remove attributes too: SetAttribute, RemoveAttribute.

// RoomAttributesEvent: the room's attributes changed (or the client logged in to a room that has
// some). Attrs holds every attribute by key, a removed one absent; Version grows with every
// change, and the Client hands over only sets newer than the last it handed over.
type RoomAttributesEvent struct {
	Attrs   map[string]string
	Version uint64
}

func (*RoomAttributesEvent) event() {}

// Attributes returns the room's attributes as the Client last received them (nil before any),
// and their version.
func (c *Client) Attributes() (map[string]string, uint64) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return maps.Clone(c.d.attrs), c.d.attrsVersion
}

// attributes takes a RoomAttributes frame: a newer set than the last is handed to the app.
func (d *delivery) attributes(a *clientpb.RoomAttributes) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || a.GetVersion() <= d.attrsVersion {
		return
	}
	attrs := make(map[string]string, len(a.GetAttributes()))
	for _, kv := range a.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue()
	}
	d.attrs, d.attrsVersion = attrs, a.GetVersion()
	d.enqueueLocked(item{ev: &RoomAttributesEvent{Attrs: maps.Clone(attrs), Version: a.GetVersion()}})
}

// AttributeError is the server's refusal of a SetAttribute or RemoveAttribute: the connection
// stays up.
type AttributeError struct {
	// Code is a clientpb.ErrorCode: 150 ATTRIBUTES_NOT_ALLOWED, 125 ATTRIBUTES_FULL, 100
	// BAD_REQUEST (a bad key), 103 FORBIDDEN (muted or banned), 105 ROOM_NOT_FOUND (closed),
	// 120 SEND_RATE_LIMITED (this connection, or the room's members together, changed its
	// attributes too often: RetryAfter),
	// 503 UNAVAILABLE.
	Code uint32
	// Message is the server's explanation.
	Message string
	// RetryAfter is the server's hint with 120: the same change may be taken after this long.
	RetryAfter time.Duration
}

// Error implements error.
func (e *AttributeError) Error() string {
	return fmt.Sprintf("roomcast: attribute change refused: code %d (%s): %s",
		e.Code, clientpb.ErrorCode(e.Code).String(), e.Message)
}

// Is lets errors.Is match an AttributeError by code: errors.Is(err, sdk.ErrAttributesNotAllowed).
func (e *AttributeError) Is(target error) bool {
	t, ok := target.(*AttributeError)
	return ok && t.Code == e.Code
}

// Attribute errors to match with errors.Is.
var (
	// ErrAttributesNotAllowed: the room does not let this member change this attribute (its
	// attributes_expr does not match the member, names nobody, or its attribute_keys do not
	// name the key).
	ErrAttributesNotAllowed = &AttributeError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED)}
	// ErrAttributesFull: the change would take the room past its limits (16 attributes, 4096
	// bytes a value, 16384 bytes of values together).
	ErrAttributesFull = &AttributeError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_FULL)}
)

// SetAttribute sets one of the room's attributes to value, for a member the room permits, and
// returns the version of the room's attributes it made. Every member, this one included, then
// receives the whole set (RoomAttributesEvent) as it does for the app server's changes.
func (c *Client) SetAttribute(ctx context.Context, key, value string) (uint64, error) {
	return c.setAttribute(ctx, &clientpb.SetAttribute{Key: key, Value: value})
}

// RemoveAttribute takes one of the room's attributes out, as SetAttribute sets one. A key the
// room does not have changes nothing and is no error.
func (c *Client) RemoveAttribute(ctx context.Context, key string) (uint64, error) {
	return c.setAttribute(ctx, &clientpb.SetAttribute{Key: key, Remove: true})
}

// setAttribute sends a SetAttribute on the current connection and waits for its answer.
func (c *Client) setAttribute(ctx context.Context, req *clientpb.SetAttribute) (uint64, error) {
	const what = "set attribute"
	return onConn(c, ctx, what, func(cur *conn) (uint64, error) {
		r := cur.request(ctx, what, func(seq uint64) *clientpb.Frame {
			req.Seq = seq
			return &clientpb.Frame{Kind: &clientpb.Frame_SetAttribute{SetAttribute: req}}
		})
		switch {
		case r.err != nil:
			return 0, r.err
		case r.attr == nil:
			return 0, fmt.Errorf("%w: a SetAttribute answered by another frame", ErrProtocol)
		case r.attr.GetCode() != 0:
			return 0, &AttributeError{Code: r.attr.GetCode(), Message: r.attr.GetMessage(),
				RetryAfter: time.Duration(r.attr.GetRetryAfterMs()) * time.Millisecond}
		}
		return r.attr.GetVersion(), nil
	})
}
