package room

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// SettingsBucket is the JetStream KV bucket that holds rooms' delivery settings, keyed
// "<app>.<room>".
const SettingsBucket = "rc_room_settings"

// MaxFlushTickMS bounds a room's flush tick.
const MaxFlushTickMS = 1000

// settingsStore keeps every room's settings in JetStream KV and a copy in memory, fed by a
// watch, so every instance answers joins without a KV read.
type settingsStore struct {
	kv      jetstream.KeyValue
	watcher jetstream.KeyWatcher
	done    chan struct{}
	log     *slog.Logger

	mu    sync.RWMutex // guards rooms
	rooms map[string]*pb.RoomSettings
}

func openSettings(ctx context.Context, nc *nats.Conn, log *slog.Logger) (*settingsStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("room: jetstream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: SettingsBucket, Description: "Roomcast room delivery settings"})
	if err != nil {
		return nil, fmt.Errorf("room: settings bucket: %w", err)
	}
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		return nil, fmt.Errorf("room: watch settings: %w", err)
	}
	s := &settingsStore{kv: kv, watcher: w, done: make(chan struct{}), log: log, rooms: make(map[string]*pb.RoomSettings)}
	loaded := make(chan struct{})
	go s.follow(loaded)
	select {
	case <-loaded:
		return s, nil
	case <-ctx.Done():
		s.close()
		return nil, fmt.Errorf("room: loading settings: %w", ctx.Err())
	}
}

// follow applies the watch's updates until it stops; loaded is closed once the initial values
// are in.
func (s *settingsStore) follow(loaded chan struct{}) {
	defer close(s.done)
	for e := range s.watcher.Updates() {
		if e == nil {
			close(loaded)
			continue
		}
		s.mu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			var st pb.RoomSettings
			if err := proto.Unmarshal(e.Value(), &st); err != nil {
				s.log.Warn("room settings do not parse", "key", e.Key(), "err", err)
			} else {
				s.rooms[e.Key()] = &st
			}
		} else {
			delete(s.rooms, e.Key())
		}
		s.mu.Unlock()
	}
}

func (s *settingsStore) close() {
	_ = s.watcher.Stop()
	<-s.done
}

func settingsKey(app, room string) string { return app + "." + room }

// get returns the room's settings, or nil for the defaults.
func (s *settingsStore) get(app, room string) *pb.RoomSettings {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rooms[settingsKey(app, room)]
}

func (s *settingsStore) put(ctx context.Context, app, room string, st *pb.RoomSettings) error {
	b, err := proto.Marshal(st)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, settingsKey(app, room), b); err != nil {
		return fmt.Errorf("room: store settings: %w", err)
	}
	s.mu.Lock()
	s.rooms[settingsKey(app, room)] = st
	s.mu.Unlock()
	return nil
}

// ValidateSettings checks settings a caller wants for a room.
func ValidateSettings(st *pb.RoomSettings) error {
	if st.FlushTickMs > MaxFlushTickMS {
		return fmt.Errorf("flush_tick_ms %d is over the limit of %d", st.FlushTickMs, MaxFlushTickMS)
	}
	for name, src := range map[string]string{"send_expr": st.SendExpr, "broadcast_expr": st.BroadcastExpr} {
		if src == "" {
			continue
		}
		if _, err := exprs.Get(src); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if st.ScopePrefix != "" && (len(st.ScopePrefix) > tag.MaxTagBytes || tag.Validate([]string{st.ScopePrefix}) != nil) {
		return fmt.Errorf("scope_prefix %q is not the start of a valid tag", st.ScopePrefix)
	}
	return nil
}
