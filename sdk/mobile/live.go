package mobile

import (
	"slices"
	"strings"
)

// The room's live state (docs/protocol.md, "Viewer counts", "Room attributes"), read when the
// app wants it: the Client keeps the newest it received.

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
