// Package api is the server API for app backends: the gRPC service roomcast.v1.RoomcastAPI
// (proto/api.proto) and the same calls over HTTP/JSON (http.go). It manages rooms (rooms.go),
// lists their members (members.go), sends to rooms, users, sessions and every room (messages.go), kicks, mutes and bans
// (moderation.go), counts who is online (online.go), answers about users, their sessions and
// tags (users.go), sets rooms' CDN modes and apps' CDN policies (cdn.go), and pages rooms'
// history (history.go). The kicks, mutes, member lists and counts by tag expression share
// byexpr.go.
//
// Every call carries an API key, which names the app it acts for; rooms and users of other apps
// are invisible to it. The API keeps no state and must not: it writes rooms and restrictions to
// JetStream KV (roomstore.Store, cdnstore.Store), at-least-once messages to users to their store
// (inbox.Store), and asks the room and presence services and the ChatLinks over NATS
// (requests.go), so any number of instances can serve. It must not reach into a component but
// through the bus and the stores (store/); a room service in its process is handed to it as a
// RoomSender (internal/deptest checks that it imports no component).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"roomcast/internal/auth"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/apipb"
	"roomcast/store/applimits"
	"roomcast/store/attrstore"
	"roomcast/store/cdnstore"
	"roomcast/store/counterstore"
	"roomcast/store/inbox"
	"roomcast/store/roomstore"
	"roomcast/tag"
)

// Limits of the server API.
const (
	// maxAPIBody limits a request: an HTTP body, or a gRPC message.
	maxAPIBody = 64 << 10
	// maxUIDsPerSend limits the users one SendToUsers names.
	maxUIDsPerSend = 100
	// maxNameBytes limits a room's display name.
	maxNameBytes = 256
	// defaultPageSize and maxPageSize bound a member list page.
	defaultPageSize = 100
	maxPageSize     = 1000
	// DefaultNoticeSpread is Config.NoticeSpread's default.
	DefaultNoticeSpread = 5 * time.Second
	// exprCacheSize bounds the compiled tag expressions an API instance keeps.
	exprCacheSize = 4096
)

// Config configures the server API.
type Config struct {
	// Bus is the NATS connection to the services. Required; its server must have JetStream.
	Bus *nats.Conn
	// Keys maps API keys to their apps and scopes (Scopes; a key with none has every scope).
	// Required. API.SetKeys replaces them while the API runs.
	Keys auth.APIKeys
	// Timeout bounds each request to a service or a node. Zero value means 3s.
	Timeout time.Duration
	// BodyTimeout bounds how long an HTTP request's body may take to arrive: a client that
	// announces a body and sends it slowly, or not at all, gets 400 and its connection is
	// closed. Zero value means 10s.
	BodyTimeout time.Duration
	// Log receives the API's logs. Zero value means none.
	Log *slog.Logger
	// KVReplicas is the replication of the KV buckets and of the inbox stream, when the API
	// creates them. Zero value means 1.
	KVReplicas int
	// Inbox sets the expiry and the limits of the at-least-once messages to users.
	Inbox InboxConfig
	// Registerer receives the API's metrics (roomcast_api_*). Zero value means they are kept
	// but not exported.
	Registerer prometheus.Registerer
	// Audit receives a record of every call that changes something (observe.go). Zero value
	// means Log.
	Audit *slog.Logger
	// Limits bound the calls of each API key (ratelimit.go). Zero value means
	// DefaultCallLimits.
	Limits CallLimits
	// NoticeSpread is how long the ChatLinks take to write a SendToAllRooms notice to all
	// their rooms when the call does not say (each room at its own moment within it). Zero
	// value means 5s.
	NoticeSpread time.Duration
	// Rooms is a room service instance in the same process, which takes the API's sends to
	// rooms without the NATS round trip. Zero value means none: sends go over NATS.
	Rooms RoomSender
}

// RoomSender is a room service in the server API's process (the wiring, internal/roles, hands
// it a room.Service's).
type RoomSender interface {
	// SendLocalQueued checks, stamps and hands on sends to one room as the room service's NATS
	// handlers would, before it returns, and gives their outcome, whose Reply may wait for a
	// window; false when it takes no sends (then NATS).
	SendLocalQueued(ctx context.Context, reqs []*buspb.SendRequest) (q QueuedSend, ok bool)
}

// QueuedSend is the outcome of sends a RoomSender took.
type QueuedSend interface {
	// Waits reports whether Reply waits for the sends' window to be published (a critical send
	// under a batch window); otherwise it returns at once.
	Waits() bool
	// Reply returns the reply, once it is known. It is called once.
	Reply() *buspb.Reply
}

// InboxConfig configures the at-least-once messages to users (SendToUsers with at_least_once).
type InboxConfig struct {
	// Expiry is how long a message stays stored unacknowledged when the send does not say.
	// Zero value means 24h.
	Expiry time.Duration
	// MaxExpiry is the longest expiry a send may ask for, and the store's age limit. Zero
	// value means 7 days.
	MaxExpiry time.Duration
	// MaxPerUser is how many messages a user may have stored; a send to a user who has that
	// many fails for that user (INBOX_FULL). Zero value means 100.
	MaxPerUser int
}

// withDefaults checks the required fields and fills in the zero values' defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("api: Config.Bus is required")
	}
	if len(c.Keys) == 0 {
		return c, errors.New("api: Config.Keys needs at least one key")
	}
	for _, k := range c.Keys {
		if err := CheckScopes(k.Scopes); err != nil {
			return c, fmt.Errorf("api: the key of app %q: %w", k.App, err)
		}
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Second
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Audit == nil {
		c.Audit = c.Log
	}
	if c.KVReplicas <= 0 {
		c.KVReplicas = 1
	}
	if c.Inbox.Expiry <= 0 {
		c.Inbox.Expiry = inbox.DefaultExpiry
	}
	if c.Inbox.MaxExpiry <= 0 {
		c.Inbox.MaxExpiry = max(inbox.DefaultMaxExpiry, c.Inbox.Expiry)
	}
	if c.Inbox.Expiry > c.Inbox.MaxExpiry {
		return c, fmt.Errorf("api: inbox expiry %v is longer than the maximum %v", c.Inbox.Expiry, c.Inbox.MaxExpiry)
	}
	if c.Inbox.MaxPerUser <= 0 {
		c.Inbox.MaxPerUser = inbox.DefaultMaxPerUser
	}
	if c.NoticeSpread <= 0 {
		c.NoticeSpread = DefaultNoticeSpread
	}
	c.NoticeSpread = min(c.NoticeSpread, maxNoticeSpread)
	c.Limits = c.Limits.withDefaults()
	return c, nil
}

// API is the server API. Its methods implement RoomcastAPI; Register serves them over HTTP and
// NewGRPCServer over gRPC.
type API struct {
	apipb.UnimplementedRoomcastAPIServer

	cfg      Config
	log      *slog.Logger // cfg.Log, naming the API in each record
	audit    *slog.Logger // cfg.Audit, naming the audit trail in each record
	m        *metrics
	store    *roomstore.Store
	cdn      *cdnstore.Store
	inbox    *inbox.Store        // the at-least-once messages to users
	counters *counterstore.Store // the rooms' counters (counters.go)
	attrs    *attrstore.Store    // the rooms' attributes (attributes.go)
	ids      ids.Generator
	exprs    *tag.Cache // tag expressions checked, compiled once
	calls    *callLimiter
	// The apps' own limits (limits.go): written by SetAppLimits, read through a cache.
	limitStore *applimits.Store
	appLimits  *applimits.Cache
	// keys are the API keys in force: cfg.Keys, until SetKeys replaces them.
	keys atomic.Pointer[auth.APIKeys]
}

var _ apipb.RoomcastAPIServer = (*API)(nil)

// New opens the KV buckets and returns the server API.
func New(cfg Config) (*API, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := roomstore.OpenStore(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	cdn, err := cdnstore.OpenStore(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Bus)
	if err != nil {
		return nil, fmt.Errorf("api: jetstream: %w", err)
	}
	in, err := inbox.Open(ctx, js, inbox.Config{Replicas: cfg.KVReplicas, MaxPerUser: cfg.Inbox.MaxPerUser, MaxExpiry: cfg.Inbox.MaxExpiry})
	if err != nil {
		return nil, err
	}
	ls, err := applimits.Open(ctx, js, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	cs, err := counterstore.Open(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	as, err := attrstore.Open(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	a := &API{counters: cs, attrs: as, cfg: cfg, log: cfg.Log.With("svc", "api"), audit: cfg.Audit.With("svc", "api", "audit", true), m: newMetrics(cfg.Registerer), store: st, cdn: cdn, inbox: in, exprs: tag.NewCache(exprCacheSize),
		calls: newCallLimiter(cfg.Limits, cfg.Registerer), limitStore: ls, appLimits: applimits.NewCache(ls, appLimitsMaxAge)}
	a.keys.Store(&cfg.Keys)
	return a, nil
}

// SetKeys replaces the API keys in force: calls that arrive after it returns are checked
// against keys, so a key left out stops working and a new one starts. Keys that would not
// pass New (none, an unknown scope) are refused and the keys in force stay.
func (a *API) SetKeys(keys auth.APIKeys) error {
	if len(keys) == 0 {
		return errors.New("api: no API key")
	}
	for _, k := range keys {
		if err := CheckScopes(k.Scopes); err != nil {
			return fmt.Errorf("api: the key of app %q: %w", k.App, err)
		}
	}
	a.keys.Store(&keys)
	return nil
}

// lookupKey returns what an API key grants, among the keys in force.
func (a *API) lookupKey(key string) (auth.APIKey, bool) {
	if keys := a.keys.Load(); keys != nil {
		return keys.Lookup(key)
	}
	return a.cfg.Keys.Lookup(key) // an API made without New (tests)
}

// NewGRPCServer returns a gRPC server serving the API (and the reflection service, for
// grpcurl); opts add to its options (grpc.Creds for TLS). The caller serves it on a listener
// and stops it.
func (a *API) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(a.observeGRPC, a.authenticate, a.limitGRPC), grpc.ChainStreamInterceptor(a.authenticateStream), grpc.MaxRecvMsgSize(maxAPIBody)}, opts...)...)
	apipb.RegisterRoomcastAPIServer(s, a)
	reflection.Register(s)
	return s
}
