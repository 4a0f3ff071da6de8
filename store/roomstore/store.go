// Package roomstore holds the rooms' shared data in JetStream KV: the rooms (apipb.Room: settings,
// status, tag mutes), their members' restrictions (mutes and bans) and the member tags the app
// server set, with their keys; and what a room accepts from a sender (send.go). The server API
// writes it; the room service follows it (its cache) and the room queue service reads it. It
// must not enforce anything (admitting a login or a send is the room service's) nor import a
// component.
package roomstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/proto/apipb"
	"roomcast/proto/roompb"
)

// JetStream KV buckets: what must survive restarts.
const (
	// BucketRooms holds one apipb.Room per created room, under "<app>.<room>".
	BucketRooms = "rc_rooms"
	// BucketRestrictions holds one apipb.MemberRestriction per muted or banned user of a room,
	// under "<app>.<room>.<uid>".
	BucketRestrictions = "rc_room_restrictions"
	// BucketMemberTags holds one roompb.MemberTags per user whose tags the app server set, under
	// "<app>.<uid>".
	BucketMemberTags = "rc_member_tags"
)

// Store reads and writes rooms, member restrictions and member tags in JetStream KV: the room
// service watches it (cache), the server API writes it. App, room and uid are valid names
// (auth.ValidName), so they cannot contain the dots that separate key parts.
type Store struct {
	rooms, restrictions, memberTags jetstream.KeyValue
}

// OpenStore creates the KV buckets, or updates their configuration, with replicas copies each
// (zero means 1).
func OpenStore(ctx context.Context, nc *nats.Conn, replicas int) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("room: jetstream: %w", err)
	}
	if replicas <= 0 {
		replicas = 1
	}
	s := &Store{}
	for bucket, kv := range map[string]*jetstream.KeyValue{BucketRooms: &s.rooms, BucketRestrictions: &s.restrictions, BucketMemberTags: &s.memberTags} {
		*kv, err = bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
			Bucket: bucket, History: 1, Replicas: replicas,
			Description: "Roomcast room state (room package)",
		})
		if err != nil {
			return nil, fmt.Errorf("room: KV bucket %s: %w", bucket, err)
		}
	}
	return s, nil
}

// RoomKey, RestrictionKey and MemberTagsKey are the keys of BucketRooms, BucketRestrictions
// and BucketMemberTags.
func RoomKey(app, room string) string             { return app + "." + room }
func RestrictionKey(app, room, uid string) string { return app + "." + room + "." + uid }
func MemberTagsKey(app, uid string) string        { return app + "." + uid }

// Buckets returns the three buckets, for following them: BucketRooms, BucketRestrictions and
// BucketMemberTags.
func (s *Store) Buckets() []jetstream.KeyValue {
	return []jetstream.KeyValue{s.rooms, s.restrictions, s.memberTags}
}

// Room returns a room's record and its revision, or nil when it was never created.
func (s *Store) Room(ctx context.Context, app, room string) (*apipb.Room, uint64, error) {
	e, err := s.rooms.Get(ctx, RoomKey(app, room))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("room: read %s: %w", room, err)
	}
	var r apipb.Room
	if err := proto.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("room: decode %s: %w", room, err)
	}
	return &r, e.Revision(), nil
}

// CreateRoom stores r unless the room exists; it reports whether it did.
func (s *Store) CreateRoom(ctx context.Context, app string, r *apipb.Room) (bool, error) {
	b, err := proto.Marshal(r)
	if err != nil {
		return false, err
	}
	_, err = s.rooms.Create(ctx, RoomKey(app, r.Room), b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("room: create %s: %w", r.Room, err)
	}
	return true, nil
}

// ErrRoomNotFound is what UpdateRoom's change function gets no chance to see.
var ErrRoomNotFound = errors.New("room: not found")

// UpdateRoom applies change to a created room's record, retrying when another writer got there
// first. change may return an error to give up.
func (s *Store) UpdateRoom(ctx context.Context, app, room string, change func(*apipb.Room) error) (*apipb.Room, error) {
	for {
		r, rev, err := s.Room(ctx, app, room)
		if err != nil {
			return nil, err
		}
		if r == nil {
			return nil, ErrRoomNotFound
		}
		if err := change(r); err != nil {
			return nil, err
		}
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		_, err = s.rooms.Update(ctx, RoomKey(app, room), b, rev)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) { // a revision mismatch
			return nil, fmt.Errorf("room: update %s: %w", room, err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// PutMemberTags stores a user's tags.
func (s *Store) PutMemberTags(ctx context.Context, app string, t *roompb.MemberTags) error {
	b, err := proto.Marshal(t)
	if err != nil {
		return err
	}
	if _, err := s.memberTags.Put(ctx, MemberTagsKey(app, t.Uid), b); err != nil {
		return fmt.Errorf("room: store tags of %s: %w", t.Uid, err)
	}
	return nil
}

// MemberTags returns a user's stored tags, or nil.
func (s *Store) MemberTags(ctx context.Context, app, uid string) (*roompb.MemberTags, error) {
	e, err := s.memberTags.Get(ctx, MemberTagsKey(app, uid))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("room: read tags of %s: %w", uid, err)
	}
	var t roompb.MemberTags
	if err := proto.Unmarshal(e.Value(), &t); err != nil {
		return nil, fmt.Errorf("room: decode tags of %s: %w", uid, err)
	}
	return &t, nil
}

// Mute returns the change (for UpdateRestriction) that mutes a member until untilMs (0: until
// lifted), or with lift lifts the mute: the server API's MuteMember and a moderator's mute
// (room service) write the same record.
func Mute(lift bool, untilMs int64) func(*apipb.MemberRestriction) {
	return func(r *apipb.MemberRestriction) {
		r.Muted, r.MutedUntilMs = !lift, untilMs
		if lift {
			r.MutedUntilMs = 0
		}
	}
}

// UpdateRestriction applies change to a user's restriction in a room (a new one when there is
// none), retrying on conflicts.
func (s *Store) UpdateRestriction(ctx context.Context, app, room, uid string, change func(*apipb.MemberRestriction)) (*apipb.MemberRestriction, error) {
	key := RestrictionKey(app, room, uid)
	for {
		var r apipb.MemberRestriction
		var rev uint64
		e, err := s.restrictions.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("room: read restriction: %w", err)
		default:
			if err := proto.Unmarshal(e.Value(), &r); err != nil {
				return nil, fmt.Errorf("room: decode restriction: %w", err)
			}
			rev = e.Revision()
		}
		r.Room, r.Uid = room, uid
		change(&r)
		b, err := proto.Marshal(&r)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = s.restrictions.Create(ctx, key, b)
		} else {
			_, err = s.restrictions.Update(ctx, key, b, rev)
		}
		if err == nil {
			return &r, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("room: write restriction: %w", err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}
