// Package cdnstore holds the CDN path's shared data in JetStream KV: the apps' CDN policies and
// rooms' pins (BucketPolicy), which the server API writes and the CDN manager follows, and the
// rooms in CDN mode (BucketRoutes), which the CDN manager writes and the room service and the
// CDN pushers follow. It defines the buckets, their keys and values and the checks of a policy;
// it must not decide anything (which room takes the CDN path and who writes it is the CDN
// manager's) nor import a component.
package cdnstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// BucketPolicy holds what apps asked for: one CdnPolicy per app under "<app>", and one RoomCdn
// (automatic, pinned_mode) per room the app set, under "<app>.<room>". The server API writes
// it; the manager watches it. App and room names have no dots (auth.ValidName), so the keys
// cannot collide.
const BucketPolicy = "rc_cdn_policy"

// BucketRoutes is the KV bucket of the rooms in CDN mode: one CdnRoute per room, under
// RouteKey, written by the CDN manager, followed by the room service and the pushers.
const BucketRoutes = "rc_cdn_rooms"

// DefaultWindow is the segments' window when the CDN manager's and the pushers' configs set
// none (cdnmanager.Config.Window, cdnpusher.Config.Window): the two must agree.
const DefaultWindow = time.Second

// RouteKey is a room's key in BucketRoutes.
func RouteKey(app, room string) string { return app + "." + room }

// OpenRoutes creates BucketRoutes, or binds to it, with replicas copies (zero means 1). The
// manager, the room service and the pushers each call it, so none depends on who starts first.
func OpenRoutes(ctx context.Context, nc *nats.Conn, replicas int) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cdnstore: jetstream: %w", err)
	}
	kv, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketRoutes, History: 1, Replicas: max(1, replicas),
		Description: "Roomcast rooms in CDN mode (cdnmanager)",
	})
	if err != nil {
		return nil, fmt.Errorf("cdnstore: KV bucket %s: %w", BucketRoutes, err)
	}
	return kv, nil
}

// Limits of a policy.
const (
	MaxVendors      = 16
	MaxRegions      = 16
	MaxPollInterval = 60_000 // ms
)

// Store reads and writes the apps' CDN policies and rooms' pins, and the routes: the server
// API's view of the CDN manager, and the CDN manager's own.
type Store struct {
	policy, routes jetstream.KeyValue
}

// OpenStore creates the KV buckets, or binds to them, with replicas copies each (zero means 1).
func OpenStore(ctx context.Context, nc *nats.Conn, replicas int) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cdnstore: jetstream: %w", err)
	}
	policy, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketPolicy, History: 1, Replicas: max(1, replicas),
		Description: "Roomcast CDN policies and room pins (cdnmanager)",
	})
	if err != nil {
		return nil, fmt.Errorf("cdnstore: KV bucket %s: %w", BucketPolicy, err)
	}
	routes, err := OpenRoutes(ctx, nc, replicas)
	if err != nil {
		return nil, err
	}
	return &Store{policy: policy, routes: routes}, nil
}

// Policies is BucketPolicy, for following it (bus.FollowKV).
func (s *Store) Policies() jetstream.KeyValue { return s.policy }

// Routes is BucketRoutes, for following it (bus.FollowKV).
func (s *Store) Routes() jetstream.KeyValue { return s.routes }

// SetRoute stores a room's route; a nil route deletes it (the room leaves CDN mode).
func (s *Store) SetRoute(ctx context.Context, app, room string, r *buspb.CdnRoute) error {
	key := RouteKey(app, room)
	if r == nil {
		if err := s.routes.Delete(ctx, key); err != nil {
			return fmt.Errorf("cdnstore: delete %s: %w", key, err)
		}
		return nil
	}
	return put(ctx, s.routes, key, r)
}

// get reads key into m; it reports false for a key never written.
func get(ctx context.Context, kv jetstream.KeyValue, key string, m proto.Message) (bool, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cdnstore: read %s: %w", key, err)
	}
	if err := proto.Unmarshal(e.Value(), m); err != nil {
		return false, fmt.Errorf("cdnstore: decode %s: %w", key, err)
	}
	return true, nil
}

func put(ctx context.Context, kv jetstream.KeyValue, key string, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("cdnstore: write %s: %w", key, err)
	}
	return nil
}

// Policy returns an app's policy as stored: empty if the app never set one.
func (s *Store) Policy(ctx context.Context, app string) (*apipb.CdnPolicy, error) {
	p := &apipb.CdnPolicy{}
	_, err := get(ctx, s.policy, app, p)
	return p, err
}

// SetPolicy stores an app's policy (CheckPolicy first).
func (s *Store) SetPolicy(ctx context.Context, app string, p *apipb.CdnPolicy) error {
	return put(ctx, s.policy, app, p)
}

// SetRoomCdn stores what the app asked for a room: automatic, or mode pinned.
func (s *Store) SetRoomCdn(ctx context.Context, app, room string, automatic bool, mode clientpb.CdnMode) error {
	if automatic {
		mode = clientpb.CdnMode_CDN_MODE_OFF
	}
	return put(ctx, s.policy, app+"."+room, &apipb.RoomCdn{Room: room, Automatic: automatic, PinnedMode: mode})
}

// RoomCdn returns what the app asked for a room (automatic for a room never set) and what is in
// force, from the room's route.
func (s *Store) RoomCdn(ctx context.Context, app, room string) (*apipb.RoomCdn, error) {
	rc := &apipb.RoomCdn{}
	found, err := get(ctx, s.policy, app+"."+room, rc)
	if err != nil {
		return nil, err
	}
	if !found {
		rc.Automatic = true
	}
	rc.Room = room
	var route buspb.CdnRoute
	if found, err = get(ctx, s.routes, RouteKey(app, room), &route); err != nil {
		return nil, err
	}
	if found {
		rc.Mode, rc.Pusher, rc.Config = route.Mode, route.Pusher, route.Config
	}
	return rc, nil
}

// CheckPolicy returns why p cannot be an app's policy, or nil.
func CheckPolicy(p *apipb.CdnPolicy) error {
	switch {
	case len(p.Vendors) > MaxVendors:
		return fmt.Errorf("at most %d vendors", MaxVendors)
	case p.PollIntervalMs > MaxPollInterval || p.PollJitterMs > MaxPollInterval:
		return fmt.Errorf("poll_interval_ms and poll_jitter_ms must be at most %d", MaxPollInterval)
	case p.FlowControlLevel > 1 || math.IsNaN(p.FlowControlLevel):
		return errors.New("flow_control_level must be at most 1")
	case clientpb.CdnMode_name[int32(p.RuleMode)] == "":
		return fmt.Errorf("unknown rule_mode %d", p.RuleMode)
	}
	for i, v := range p.Vendors {
		switch {
		case v == nil:
			return fmt.Errorf("vendor %d is empty", i)
		case CheckURL(v.UrlTemplate) != nil:
			return fmt.Errorf("vendor %d: url_template %q is not an http(s) URL of at most 512 bytes", i, v.UrlTemplate)
		case !strings.Contains(v.UrlTemplate, "{index}"):
			return fmt.Errorf("vendor %d: url_template has no {index}", i)
		case len(v.Regions) > MaxRegions:
			return fmt.Errorf("vendor %d: at most %d regions", i, MaxRegions)
		}
		for _, r := range v.Regions {
			if r == "" || len(r) > 64 {
				return fmt.Errorf("vendor %d: a region of 1-64 bytes, not %q", i, r)
			}
		}
	}
	return nil
}

// CheckURL accepts an absolute http or https URL of sane length.
func CheckURL(u string) error {
	if len(u) > 512 || !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
		return fmt.Errorf("%q is not an http(s) URL of at most 512 bytes", u)
	}
	return nil
}
