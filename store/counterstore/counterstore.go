// Package counterstore keeps the rooms' counters (likes, gifts: docs/protocol.md, "Counters") in
// the JetStream KV bucket rc_room_counters: one roompb.CounterRecord per room with the totals and,
// per ChatLink boot, the last counting window applied, so that a window sent again is applied
// once. The room service writes it (room/counters.go), the server API reads it. It also holds the
// rules every role checks a counter's name by. It must not apply windows nor import a component.
package counterstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// Bucket holds one roompb.CounterRecord per room that has counters, under "<app>.<room>".
const Bucket = "rc_room_counters"

const (
	// MaxNameLen is the longest counter name.
	MaxNameLen = 32
	// MaxPerRoom is how many counters a room may have: an add to a new name beyond it is refused
	// (124 TOO_MANY_COUNTERS) until the app server resets one.
	MaxPerRoom = 32
)

// ErrConflict is Put's answer when the record changed since the revision it was given.
var ErrConflict = errors.New("counterstore: the record changed")

// ValidName reports whether name may name a counter: 1 to MaxNameLen characters of
// A-Z a-z 0-9 _ - : .
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == ':', c == '.':
		default:
			return false
		}
	}
	return true
}

// Key is the record's key of a room. App and room are valid names (auth.ValidName), without dots.
func Key(app, room string) string { return app + "." + room }

// Store reads and writes the rooms' counter records.
type Store struct {
	kv jetstream.KeyValue
}

// Open creates the bucket, or updates its configuration, with replicas copies (zero means 1).
func Open(ctx context.Context, nc *nats.Conn, replicas int) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("counterstore: jetstream: %w", err)
	}
	kv, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, Replicas: max(replicas, 1),
		Description: "Roomcast room counters (store/counterstore)",
	})
	if err != nil {
		return nil, fmt.Errorf("counterstore: KV bucket %s: %w", Bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Get returns a room's record and its revision; an empty record and revision 0 when the room
// has no counters yet.
func (s *Store) Get(ctx context.Context, app, room string) (*roompb.CounterRecord, uint64, error) {
	e, err := s.kv.Get(ctx, Key(app, room))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &roompb.CounterRecord{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("counterstore: read %s/%s: %w", app, room, err)
	}
	var rec roompb.CounterRecord
	if err := proto.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("counterstore: record of %s/%s: %w", app, room, err)
	}
	return &rec, e.Revision(), nil
}

// Put writes a room's record if it is still at revision rev (0: there is none), and returns the
// new revision; ErrConflict (wrapped) when another writer got there first.
func (s *Store) Put(ctx context.Context, app, room string, rec *roompb.CounterRecord, rev uint64) (uint64, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(rec)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev, err = s.kv.Create(ctx, Key(app, room), b)
	} else {
		rev, err = s.kv.Update(ctx, Key(app, room), b, rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return 0, fmt.Errorf("%w: %v", ErrConflict, err)
	case err != nil:
		return 0, fmt.Errorf("counterstore: write %s/%s: %w", app, room, err)
	}
	return rev, nil
}

// Totals returns what members are told of a record at revision rev: the counters by name.
func Totals(rec *roompb.CounterRecord, rev uint64) *clientpb.CounterTotals {
	t := &clientpb.CounterTotals{Version: rev, Counters: make([]*clientpb.Counter, 0, len(rec.GetTotals()))}
	for name, total := range rec.GetTotals() {
		t.Counters = append(t.Counters, &clientpb.Counter{Name: name, Total: total})
	}
	slices.SortFunc(t.Counters, func(a, b *clientpb.Counter) int { return strings.Compare(a.Name, b.Name) })
	return t
}
