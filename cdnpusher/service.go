package cdnpusher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/segment"
	"roomcast/store/cdnstore"
)

// A Service is one pusher instance on the bus: it takes the CDN-lane messages the room service
// sends to its subject (bus.CdnPushSubject), follows the CDN manager's routes (which rooms are
// its own, from which window, and which it hands to another pusher) and reports itself to the
// manager, whose lease on it those reports are. Several instances run at once; the manager
// spreads the rooms over them.

// ServiceConfig configures a pusher instance.
type ServiceConfig struct {
	// Bus is the NATS connection. Required; its server must have JetStream.
	Bus *nats.Conn
	// ID names the instance in the routes and its subject (1-128 of A-Z a-z 0-9 _ -). Zero value
	// means "pusher-" and a random suffix, new at every start.
	ID string
	// Pusher configures the aggregation and storage; its Logger and Registerer serve the
	// instance too.
	Pusher Config
	// ReportInterval is how often the instance reports to the manager. Zero value means 500ms.
	ReportInterval time.Duration
	// HandoffTimeout bounds how long Shutdown waits for the manager to give the instance's rooms
	// to other pushers and for the windows before the handoff to be written. Zero value means 5s.
	HandoffTimeout time.Duration
	// KVReplicas is the replication of the routes' KV bucket, when the instance creates it.
	// Zero value means 1.
	KVReplicas int
}

func (c ServiceConfig) withDefaults() (ServiceConfig, error) {
	if c.Bus == nil {
		return c, errors.New("cdnpusher: ServiceConfig.Bus is required")
	}
	if c.ID == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		c.ID = "pusher-" + hex.EncodeToString(b)
	}
	if !auth.ValidName(c.ID) {
		return c, fmt.Errorf("cdnpusher: ID %q is not 1-128 of A-Z a-z 0-9 _ -", c.ID)
	}
	if c.ReportInterval <= 0 {
		c.ReportInterval = 500 * time.Millisecond
	}
	if c.HandoffTimeout <= 0 {
		c.HandoffTimeout = 5 * time.Second
	}
	return c, nil
}

// Service is a running pusher instance.
type Service struct {
	cfg    ServiceConfig
	log    *slog.Logger
	pusher *Pusher

	sub        *nats.Subscription
	stopRoutes func()
	leaving    atomic.Bool

	mu    sync.Mutex          // guards owned
	owned map[string]struct{} // route keys naming this instance as the pusher

	stop         chan struct{}  // closed by Shutdown: the report loop ends
	reporter     sync.WaitGroup // the report loop
	shutdownOnce sync.Once
	shutdownErr  error
}

// StartService starts a pusher instance: the pusher, its subscription, the routes it follows
// and its reports. On error, whatever had started is stopped.
func StartService(cfg ServiceConfig) (_ *Service, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	p, err := New(cfg.Pusher)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, log: p.cfg.Logger.With("svc", "cdnpusher", "pusher", cfg.ID), pusher: p,
		owned: map[string]struct{}{}, stop: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // nothing was taken: write nothing
			_ = s.Shutdown(ctx)
		}
	}()
	if s.sub, err = cfg.Bus.Subscribe(bus.CdnPushSubject(cfg.ID), s.onBatch); err != nil {
		return nil, fmt.Errorf("cdnpusher: subscribe: %w", err)
	}
	_ = s.sub.SetPendingLimits(-1, 256<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := cdnstore.OpenRoutes(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	if s.stopRoutes, err = bus.FollowKV(ctx, kv, s.applyRoute); err != nil {
		return nil, err
	}
	if err = cfg.Bus.Flush(); err != nil {
		return nil, fmt.Errorf("cdnpusher: flush: %w", err)
	}
	s.reporter.Add(1)
	go s.reportLoop()
	return s, nil
}

// ID returns the instance's name.
func (s *Service) ID() string { return s.cfg.ID }

// onBatch hands a batch from the room service to the pusher. A batch published with a trace
// context (the room service's, with tracing on) is taken in a span, "cdn pusher batch", in that
// trace, and its segment's write is traced under it.
func (s *Service) onBatch(msg *nats.Msg) {
	_, span := bus.StartConsumer(msg, "cdn pusher batch")
	defer span.End()
	var b buspb.CdnBatch
	if err := proto.Unmarshal(msg.Data, &b); err != nil {
		s.log.Warn("dropping a CDN batch that does not parse")
		span.SetStatus(codes.Error, "does not parse")
		return
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("roomcast.app", b.App), attribute.Int("messaging.batch.message_count", len(b.Messages)))
	}
	from := span.SpanContext()
	for _, m := range b.Messages {
		if err := s.pusher.addFrom(b.App, m, from); err != nil {
			// ErrReleased: a message that crossed a handoff; the room service sends the
			// windows after it to the new pusher. Anything else is the sender's bug. Add
			// counts every refusal (roomcast_cdnpusher_refused_messages_total).
			s.log.Debug("message not taken", "app", b.App, "room", m.GetRoom(), "err", err)
		}
	}
}

// applyRoute follows one change of the routes: a room given to this instance is opened from
// its window on and kept, quiet or not, while the route names the instance; a room given away
// is released at the handoff; a room leaving CDN mode (until_index) is released there; a room
// whose route is gone at once (no pusher was live) is written out to the current window.
func (s *Service) applyRoute(key string, value []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, mine := s.owned[key]
	if value == nil {
		if mine {
			app, room, _ := strings.Cut(key, ".")
			s.pusher.Release(app, room, segment.Index(time.Now().UnixMilli(), s.pusher.windowMs)+1)
			delete(s.owned, key)
		}
		return
	}
	var r buspb.CdnRoute
	if err := proto.Unmarshal(value, &r); err != nil {
		s.log.Warn("route does not parse", "key", key)
		return
	}
	switch {
	case r.Pusher == s.cfg.ID:
		until := int64(noEnd)
		if r.UntilIndex != 0 {
			until = r.UntilIndex
		}
		if err := s.pusher.assign(r.App, r.Room, r.FromIndex, until, true); err != nil {
			s.log.Warn("room not opened", "app", r.App, "room", r.Room, "err", err)
			return
		}
		s.owned[key] = struct{}{}
	case mine || r.PrevPusher == s.cfg.ID:
		until := r.FromIndex
		if r.UntilIndex != 0 {
			until = min(until, r.UntilIndex)
		}
		s.pusher.Release(r.App, r.Room, until)
		delete(s.owned, key)
	}
}

// ownedRooms returns how many routes name this instance.
func (s *Service) ownedRooms() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owned)
}

func (s *Service) report() {
	err := bus.Publish(s.cfg.Bus, bus.SubjectCdnPushers, &buspb.PusherReport{
		Pusher: s.cfg.ID, TimeMs: time.Now().UnixMilli(), WindowMs: s.pusher.windowMs,
		Rooms: int64(s.pusher.Rooms()), Leaving: s.leaving.Load(),
	})
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("report not published", "err", err)
	}
}

// reportLoop reports every ReportInterval until Shutdown.
func (s *Service) reportLoop() {
	defer s.reporter.Done()
	t := time.NewTicker(s.cfg.ReportInterval)
	defer t.Stop()
	for {
		s.report()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// Shutdown hands the instance's rooms over and stops it: it reports that it is leaving, waits
// (up to HandoffTimeout, or until ctx ends) until the manager has given its rooms to other
// pushers and it has written their windows before the handoff, then stops taking messages and
// closes the pusher (Pusher.Close, with ctx). With ctx already ended it stops at once, as a
// crash would: the manager finds the instance lost when its lease ends. It may be called more
// than once; later calls return the first one's result.
func (s *Service) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		if s.stopRoutes != nil && ctx.Err() == nil {
			s.leaving.Store(true)
			s.report()
			deadline := time.Now().Add(s.cfg.HandoffTimeout)
			for (s.ownedRooms() > 0 || s.pusher.Rooms() > 0) && time.Now().Before(deadline) && ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		close(s.stop)
		s.reporter.Wait()
		if s.sub != nil {
			_ = s.sub.Unsubscribe()
		}
		if s.stopRoutes != nil {
			s.stopRoutes()
		}
		s.shutdownErr = s.pusher.Close(ctx)
	})
	return s.shutdownErr
}
