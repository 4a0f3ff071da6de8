package mobile

import (
	"context"
	"errors"
	"slices"
	"strings"

	"roomcast/sdk"
)

// The room's live state (docs/protocol.md, "Viewer counts", "Room attributes"), read when the
// app wants it: the Client keeps the newest it received. Members the room permits (its
// attributes_expr and attribute_keys) set and remove attributes: SetAttribute, RemoveAttribute.

// ViewersOnline returns the room's members online over every ChatLink, as last received (0
// before any; it comes a few seconds apart, when it changes).
func (c *Client) ViewersOnline() int64 {
	online, _ := c.c.Viewers()
	return online
}

// ViewersWithTag returns how many members online carry tag, for a tag the room's settings
// name in viewer_tags (0 for any other), as last received.
func (c *Client) ViewersWithTag(tag string) int64 {
	_, tags := c.c.Viewers()
	return tags[tag]
}

// Attributes are a room's attributes (announcement, pinned message, app data), by key
// (sorted).
type Attributes struct {
	keys, values []string
	version      int64
}

// Len returns the number of attributes.
func (a *Attributes) Len() int { return len(a.keys) }

// Key returns the i-th attribute's key.
func (a *Attributes) Key(i int) string { return a.keys[i] }

// Value returns the i-th attribute's value.
func (a *Attributes) Value(i int) string { return a.values[i] }

// Get returns the value of key, "" when the room has no such attribute.
func (a *Attributes) Get(key string) string {
	if i, ok := slices.BinarySearch(a.keys, key); ok {
		return a.values[i]
	}
	return ""
}

// Version grows with every change of the room's attributes.
func (a *Attributes) Version() int64 { return a.version }

// Attributes returns the room's attributes as last received (empty before any).
func (c *Client) Attributes() *Attributes {
	attrs, version := c.c.Attributes()
	a := &Attributes{version: toInt64(version)}
	for k := range attrs {
		a.keys = append(a.keys, k)
	}
	slices.SortFunc(a.keys, strings.Compare)
	for _, k := range a.keys {
		a.values = append(a.values, attrs[k])
	}
	return a
}

// AttributeResult is the server's answer to SetAttribute or RemoveAttribute: the version of the
// room's attributes the change made, or a refusal with its code (the connection stays up).
type AttributeResult struct {
	// Version is the room's attributes' version after the change; 0 with a refusal.
	Version int64
	// ErrorCode is 0 when the change was taken, else why it was refused:
	// ErrorAttributesNotAllowed, ErrorAttributesFull, or 100, 103, 105, 120, 503
	// (docs/protocol.md §4).
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
	// RetryAfterMs is the server's hint with 120 (this connection, or the room's members
	// together, changed its attributes too often): the change may be taken after this long.
	RetryAfterMs int64
}

// SetAttribute sets one of the room's attributes, for a member the room permits; every member,
// this one included, then reads the new set with Attributes once it arrives. It waits for
// the server's answer, at most Config.SendTimeoutMs; a refusal is a result, the error is for no
// answer.
func (c *Client) SetAttribute(key, value string) (*AttributeResult, error) {
	return c.attribute(func(ctx context.Context) (uint64, error) { return c.c.SetAttribute(ctx, key, value) })
}

// RemoveAttribute takes one of the room's attributes out, as SetAttribute sets one.
func (c *Client) RemoveAttribute(key string) (*AttributeResult, error) {
	return c.attribute(func(ctx context.Context) (uint64, error) { return c.c.RemoveAttribute(ctx, key) })
}

// attribute runs one change of the Go SDK's and converts its answer: an AttributeError is a
// result.
func (c *Client) attribute(do func(ctx context.Context) (uint64, error)) (*AttributeResult, error) {
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	version, err := do(ctx)
	if ae := (*sdk.AttributeError)(nil); errors.As(err, &ae) {
		return &AttributeResult{ErrorCode: int32(ae.Code), ErrorMessage: ae.Message, RetryAfterMs: ae.RetryAfter.Milliseconds()}, nil
	}
	if err != nil {
		return nil, err
	}
	return &AttributeResult{Version: toInt64(version)}, nil
}
