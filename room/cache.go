package room

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/apipb"
	"roomcast/proto/roompb"
	"roomcast/store/roomstore"
)

// cache is a room service instance's copy of the KV buckets, kept current by watching them, so
// that a login or a send is checked without a KV read.
type cache struct {
	log      *slog.Logger
	watchers []jetstream.KeyWatcher
	done     sync.WaitGroup

	mu              sync.RWMutex // guards the maps
	rooms           map[string]*apipb.Room
	restrictions    map[string]*apipb.MemberRestriction
	memberTagsByKey map[string]*roompb.MemberTags
}

// watch starts watching the store's buckets and returns once their current contents are loaded.
func watch(ctx context.Context, s *roomstore.Store, log *slog.Logger) (*cache, error) {
	c := &cache{log: log, rooms: make(map[string]*apipb.Room), restrictions: make(map[string]*apipb.MemberRestriction), memberTagsByKey: make(map[string]*roompb.MemberTags)}
	for _, kv := range s.Buckets() {
		w, err := kv.WatchAll(context.Background())
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("room: watch %s: %w", kv.Bucket(), err)
		}
		c.watchers = append(c.watchers, w)
		loaded := make(chan struct{})
		c.done.Add(1)
		go c.follow(kv.Bucket(), w, loaded)
		select {
		case <-loaded:
		case <-ctx.Done():
			c.stop()
			return nil, fmt.Errorf("room: loading %s: %w", kv.Bucket(), ctx.Err())
		}
	}
	return c, nil
}

func (c *cache) follow(bucket string, w jetstream.KeyWatcher, loaded chan struct{}) {
	defer c.done.Done()
	for e := range w.Updates() {
		if e == nil { // the end of the current contents
			close(loaded)
			continue
		}
		c.mu.Lock()
		switch bucket {
		case roomstore.BucketRooms:
			if e.Operation() != jetstream.KeyValuePut {
				delete(c.rooms, e.Key())
			} else if r := new(apipb.Room); proto.Unmarshal(e.Value(), r) == nil {
				c.rooms[e.Key()] = r
			}
		case roomstore.BucketRestrictions:
			if e.Operation() != jetstream.KeyValuePut {
				delete(c.restrictions, e.Key())
			} else if r := new(apipb.MemberRestriction); proto.Unmarshal(e.Value(), r) == nil {
				c.restrictions[e.Key()] = r
			}
		case roomstore.BucketMemberTags:
			if e.Operation() != jetstream.KeyValuePut {
				delete(c.memberTagsByKey, e.Key())
			} else if t := new(roompb.MemberTags); proto.Unmarshal(e.Value(), t) == nil {
				c.memberTagsByKey[e.Key()] = t
			}
		}
		c.mu.Unlock()
	}
}

func (c *cache) stop() {
	for _, w := range c.watchers {
		_ = w.Stop()
	}
	c.done.Wait()
}

func (c *cache) room(app, room string) *apipb.Room {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rooms[roomstore.RoomKey(app, room)]
}

func (c *cache) restriction(app, room, uid string) *apipb.MemberRestriction {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.restrictions[roomstore.RestrictionKey(app, room, uid)]
}

// memberTags returns the tags the app server stored for uid, or nil.
func (c *cache) memberTags(app, uid string) *roompb.MemberTags {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.memberTagsByKey[roomstore.MemberTagsKey(app, uid)]
}

// bannedAt and mutedAt say whether a restriction holds at now.
func bannedAt(r *apipb.MemberRestriction, now time.Time) bool {
	return r != nil && r.Banned && (r.BannedUntilMs == 0 || now.UnixMilli() < r.BannedUntilMs)
}

func mutedAt(r *apipb.MemberRestriction, now time.Time) bool {
	return r != nil && r.Muted && (r.MutedUntilMs == 0 || now.UnixMilli() < r.MutedUntilMs)
}
