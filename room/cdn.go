package room

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
	"roomcast/store/cdnstore"
)

// cdnRoutes is an instance's copy of the CDN routes (cdnstore.BucketRoutes), kept current by a
// watch: which rooms are in CDN mode, which pusher writes which of their windows, and what their
// members are told. The CDN manager writes them.
type cdnRoutes struct {
	kv   jetstream.KeyValue
	stop func()

	mu     sync.RWMutex // guards routes
	routes map[roomKey]*buspb.CdnRoute
}

func openCdnRoutes(ctx context.Context, s *Service) (*cdnRoutes, error) {
	kv, err := cdnstore.OpenRoutes(ctx, s.cfg.Bus, s.cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	c := &cdnRoutes{kv: kv, routes: make(map[roomKey]*buspb.CdnRoute)}
	if c.stop, err = bus.FollowKV(ctx, kv, c.apply); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *cdnRoutes) apply(key string, value []byte) {
	app, room, _ := strings.Cut(key, ".")
	k := roomKey{app, room}
	r := &buspb.CdnRoute{}
	c.mu.Lock()
	defer c.mu.Unlock()
	if value == nil || proto.Unmarshal(value, r) != nil {
		delete(c.routes, k)
		return
	}
	c.routes[k] = r
}

func (c *cdnRoutes) get(app, room string) *buspb.CdnRoute {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.routes[roomKey{app, room}]
}

// fresh reads a room's route from the store rather than the watch's copy, for the first login
// of a room on a node (see onJoin); on a read error it falls back to the copy.
func (c *cdnRoutes) fresh(ctx context.Context, app, room string) (*buspb.CdnRoute, error) {
	e, err := c.kv.Get(ctx, cdnstore.RouteKey(app, room))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, nil
	case err != nil:
		return c.get(app, room), err
	}
	r := &buspb.CdnRoute{}
	if err := proto.Unmarshal(e.Value(), r); err != nil {
		return c.get(app, room), err
	}
	return r, nil
}

// cdnLane reports whether a message of lane takes the CDN path in mode.
func cdnLane(mode clientpb.CdnMode, lane clientpb.Lane) bool {
	switch mode {
	case clientpb.CdnMode_CDN_MODE_BULK:
		return lane == clientpb.Lane_LANE_BULK
	case clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK:
		return lane == clientpb.Lane_LANE_BULK || lane == clientpb.Lane_LANE_NORMAL
	}
	return false
}

// toPusher says whether route r sends m to a pusher rather than to the room's nodes.
func toPusher(r *buspb.CdnRoute, m *clientpb.Message) bool {
	return r != nil && r.Pusher != "" && r.Mode != clientpb.CdnMode_CDN_MODE_OFF && cdnLane(r.Mode, m.Lane) && m.TagExpr == ""
}

// split takes out of a room's batch the messages its route sends to pushers: those of its CDN
// lanes without a tag expression (a segment is public; a targeted message stays on the long
// connections). Each goes to the pusher of its window: the route's pusher from from_index on,
// the previous one before (a handoff). A room without a route, or a route without a pusher,
// keeps every message, and so does a room leaving CDN mode for the messages of its windows from
// until_index on (by their server time, which broadcast stamped before the split).
func (c *cdnRoutes) split(app, room string, batch *buspb.RoomBatch) (long *buspb.RoomBatch, toPushers map[string]*buspb.CdnBatch) {
	r := c.get(app, room)
	if r == nil || r.Pusher == "" || r.Mode == clientpb.CdnMode_CDN_MODE_OFF {
		return batch, nil
	}
	long = &buspb.RoomBatch{}
	for i, m := range batch.Messages {
		w := r.Config.GetWindowMs()
		if !toPusher(r, m) || (r.UntilIndex != 0 && w > 0 && segment.Index(m.ServerTimeMs, w) >= r.UntilIndex) {
			long.Messages = append(long.Messages, m)
			long.SenderSessions = append(long.SenderSessions, batch.SenderSessions[i])
			continue
		}
		pusher := r.Pusher
		if r.PrevPusher != "" && w > 0 && segment.Index(m.ServerTimeMs, w) < r.FromIndex {
			pusher = r.PrevPusher
		}
		if toPushers == nil {
			toPushers = make(map[string]*buspb.CdnBatch)
		}
		b := toPushers[pusher]
		if b == nil {
			b = &buspb.CdnBatch{App: app}
			toPushers[pusher] = b
		}
		b.Messages = append(b.Messages, m)
	}
	return long, toPushers
}
