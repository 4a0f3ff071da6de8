// Package attrstore keeps the rooms' attributes (an announcement, a pinned message, app data:
// docs/api.md, "Room attributes") in the JetStream KV bucket rc_room_attrs: one
// clientpb.RoomAttributes per room, its version the record's revision. The server API writes it,
// and so does the room service for the members a room permits (room/attributes.go); the room
// service reads it for a node's first login of a room. It holds the limits every role
// checks an attribute by. It must not broadcast nor import a component.
package attrstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/proto/clientpb"
)

// Bucket holds one clientpb.RoomAttributes per room that has attributes, under "<app>.<room>".
const Bucket = "rc_room_attrs"

// A room's attributes are bounded so that the whole set fits one small frame.
const (
	MaxKeys       = 16
	MaxKeyLen     = 32
	MaxValueBytes = 4096
	MaxRoomBytes  = 16384 // the values of a room together
)

// ErrLimit wraps a change that would take the room past a limit.
var ErrLimit = errors.New("attrstore: over the room's attribute limits")

// ErrBadKey refuses a key that is not 1 to MaxKeyLen characters of A-Z a-z 0-9 _ - : .
var ErrBadKey = errors.New("attrstore: bad attribute key")

// writes bounds the compare-and-set attempts of one change.
const writes = 8

// ValidKey reports whether key may name an attribute.
func ValidKey(key string) bool {
	if key == "" || len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == ':', c == '.':
		default:
			return false
		}
	}
	return true
}

// Key is the record's key of a room. App and room are valid names (auth.ValidName), without dots.
func Key(app, room string) string { return app + "." + room }

// Store reads and writes the rooms' attributes.
type Store struct {
	kv jetstream.KeyValue
}

// Open creates the bucket, or updates its configuration, with replicas copies (zero means 1).
func Open(ctx context.Context, nc *nats.Conn, replicas int) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("attrstore: jetstream: %w", err)
	}
	kv, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, Replicas: max(replicas, 1),
		Description: "Roomcast room attributes (store/attrstore)",
	})
	if err != nil {
		return nil, fmt.Errorf("attrstore: KV bucket %s: %w", Bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Get returns a room's attributes, version its revision; empty and version 0 when it has none.
func (s *Store) Get(ctx context.Context, app, room string) (*clientpb.RoomAttributes, error) {
	e, err := s.kv.Get(ctx, Key(app, room))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &clientpb.RoomAttributes{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("attrstore: read %s/%s: %w", app, room, err)
	}
	var rec clientpb.RoomAttributes
	if err := proto.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("attrstore: record of %s/%s: %w", app, room, err)
	}
	rec.Version = e.Revision()
	return &rec, nil
}

// Set sets key to value (remove: takes key out) in the room's attributes and returns them as
// written; ErrBadKey or ErrLimit (wrapped) when the change is refused.
func (s *Store) Set(ctx context.Context, app, room, key, value string, remove bool, now time.Time) (*clientpb.RoomAttributes, error) {
	if !ValidKey(key) {
		return nil, fmt.Errorf("%w: %q must be 1 to %d characters of A-Z a-z 0-9 _ - : . (dot included)", ErrBadKey, key, MaxKeyLen)
	}
	if len(value) > MaxValueBytes {
		return nil, fmt.Errorf("%w: a value is at most %d bytes, not %d", ErrLimit, MaxValueBytes, len(value))
	}
	for range writes {
		cur, err := s.Get(ctx, app, room)
		if err != nil {
			return nil, err
		}
		next := &clientpb.RoomAttributes{}
		size := 0
		for _, a := range cur.Attributes {
			if a.Key != key {
				next.Attributes = append(next.Attributes, a)
				size += len(a.Value)
			}
		}
		if !remove {
			next.Attributes = append(next.Attributes, &clientpb.RoomAttribute{Key: key, Value: value, UpdatedMs: now.UnixMilli()})
			size += len(value)
			switch {
			case len(next.Attributes) > MaxKeys:
				return nil, fmt.Errorf("%w: a room has at most %d attributes", ErrLimit, MaxKeys)
			case size > MaxRoomBytes:
				return nil, fmt.Errorf("%w: a room's values are at most %d bytes together, these would be %d", ErrLimit, MaxRoomBytes, size)
			}
		}
		slices.SortFunc(next.Attributes, func(a, b *clientpb.RoomAttribute) int { return strings.Compare(a.Key, b.Key) })
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(next)
		if err != nil {
			return nil, err
		}
		var rev uint64
		if cur.Version == 0 {
			rev, err = s.kv.Create(ctx, Key(app, room), b)
		} else {
			rev, err = s.kv.Update(ctx, Key(app, room), b, cur.Version)
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // another writer got there first: apply the change to theirs
		}
		if err != nil {
			return nil, fmt.Errorf("attrstore: write %s/%s: %w", app, room, err)
		}
		next.Version = rev
		return next, nil
	}
	return nil, fmt.Errorf("attrstore: write %s/%s: %d writers in a row got there first", app, room, writes)
}
