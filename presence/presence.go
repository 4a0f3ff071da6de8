// Package presence is the presence service: who is online, in which room, on which node and
// device. It answers "is this user online", "where are its sessions" and "how many are online
// in this app", applies each app's multi-device policy, and publishes online/offline events
// for app backends (on a NATS subject, and batched to an optional webhook).
//
// The sessions are owned by the ChatLinks. Every instance keeps a full view of them, built from
// the ChatLinks' session streams (bus.SubjectSessions: event batches, snapshots, reports) and
// repaired by a resync when it starts or drifts; queries are shared by the instances in a queue
// group. A node's sessions vanish when its reports (its lease) stop: there is no timer per
// session. The service must not hold state that only one instance has.
//
// When a node's lease ends (or the node comes back with a new boot before it ends), its sessions
// get logout events with a reason (lease.go), published and posted like the ChatLinks' own, so
// that app backends and the room queue never keep ghosts. Every instance sees the lease end; one
// of them, chosen by a create in JetStream KV, emits the events.
package presence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// DevicePolicy is an app's rule for users with several sessions. A login that breaks it closes
// the user's older sessions with close code 4010 REPLACED.
type DevicePolicy struct {
	// MaxSessions is how many sessions a user may have at once. Zero value means no limit.
	MaxSessions int
	// OnePerDevice closes a user's older sessions on the same device type ("web", "ios", ...).
	OnePerDevice bool
}

// DefaultWebhookEvery is Config.WebhookEvery's default, and `roomcast services`'
// --presence-webhook-every's.
const DefaultWebhookEvery = time.Second

// Config configures a presence service instance.
type Config struct {
	// Bus is the NATS connection. Required; its server must have JetStream (lease.go).
	Bus *nats.Conn
	// Log receives the service's logs. Zero value means none.
	Log *slog.Logger
	// Queue is the NATS queue group instances share. Zero value means "presence".
	Queue string
	// LeaseTTL is how long a node's sessions outlive its last report. Zero value means 5s.
	LeaseTTL time.Duration
	// Policies holds each app's multi-device policy. Zero value means no limits for any app.
	Policies map[string]DevicePolicy
	// Webhooks maps an app to a URL that receives its online/offline events, batched, as a JSON
	// POST. Zero value means none.
	Webhooks map[string]string
	// WebhookEvery is how often batched events are posted. Zero value means
	// DefaultWebhookEvery.
	WebhookEvery time.Duration
	// HTTPClient posts to webhooks. Zero value means a client with a 5s timeout.
	HTTPClient *http.Client
	// KVReplicas is the replication of the KV bucket BucketLeaseEnds. Zero value means 1.
	KVReplicas int
	// Registerer receives the service's metrics (roomcast_presence_*); instances in one
	// process share them. Zero value means they are kept but not exported.
	Registerer prometheus.Registerer
}

// Service is one instance of the presence service.
type Service struct {
	cfg  Config
	log  *slog.Logger // cfg.Log, naming the service
	subs []*nats.Subscription
	hook *webhooks
	m    *metrics
	ends jetstream.KeyValue // who emits a node's lease-end events (lease.go)

	// Logouts of dropped nodes' sessions this instance emitted, and left to another instance
	// (lease.go).
	leaseEndsEmitted, leaseEndsSkipped atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup // the expiry loop and the webhook loop
	once sync.Once

	mu       sync.Mutex // guards the fields below
	nodes    map[string]*nodeView
	sessions *sessionTable // every node's sessions (sessions.go)
	applied  chan struct{} // closed and replaced whenever a node's sequence advances
	ended    []endedNode   // nodes dropped with their sessions, whose logouts are not emitted yet
}

// nodeView is what this instance knows of one ChatLink.
type nodeView struct {
	name       string
	id         uint32 // the node's number in s.sessions.names, which keys its sessions
	boot       string
	seq        uint64 // the last stream message applied
	seen       time.Time
	count      int64                 // its sessions
	snap       []*buspb.SessionEvent // chunks of the snapshot being received
	snapSeq    uint64
	mismatches int // consecutive reports whose session count differs from ours
	resyncAt   time.Time
}

// withDefaults returns c with the zero values replaced by the documented defaults, or an error
// for a Config New cannot use.
func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("presence: Config.Bus is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Queue == "" {
		c.Queue = "presence"
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.WebhookEvery <= 0 {
		c.WebhookEvery = DefaultWebhookEvery
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	}
	return c, nil
}

// New returns a presence service; Start subscribes it.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, log: cfg.Log.With("svc", "presence"), stop: make(chan struct{}),
		nodes: make(map[string]*nodeView), sessions: newSessionTable(), applied: make(chan struct{}), m: newMetrics(cfg.Registerer),
	}
	s.hook = &webhooks{s: s, pending: make(map[string][]*buspb.SessionEvent)}
	return s, nil
}

// Start subscribes the service and asks every ChatLink for a snapshot of its sessions.
func (s *Service) Start() error {
	subscribe := func(subject, queue string, h nats.MsgHandler) error {
		var sub *nats.Subscription
		var err error
		if queue == "" {
			sub, err = s.cfg.Bus.Subscribe(subject, h)
		} else {
			sub, err = s.cfg.Bus.QueueSubscribe(subject, queue, h)
		}
		if err != nil {
			return fmt.Errorf("presence: subscribe %s: %w", subject, err)
		}
		// A snapshot of a big node is many messages at once; do not drop them.
		_ = sub.SetPendingLimits(-1, -1)
		s.subs = append(s.subs, sub)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if s.ends, err = openLeaseEnds(ctx, s.cfg.Bus, s.cfg.KVReplicas); err != nil {
		return err
	}
	for _, err := range []error{
		subscribe(bus.SubjectSessions, "", s.onStream),
		subscribe(bus.SubjectPresenceEvents, s.cfg.Queue+"-effects", s.onEffects),
		subscribe(bus.SubjectPresenceCount, s.cfg.Queue, s.onCount),
		subscribe(bus.SubjectPresenceSessions, s.cfg.Queue, s.onSessions),
	} {
		if err != nil {
			s.Close()
			return err
		}
	}
	if err := s.cfg.Bus.Flush(); err != nil {
		s.Close()
		return fmt.Errorf("presence: subscribe: %w", err)
	}
	if err := bus.Publish(s.cfg.Bus, bus.SubjectNodesControl, &buspb.NodeControl{Op: buspb.NodeControl_OP_RESYNC}); err != nil {
		s.log.Warn("resync request not published", "err", err)
	}
	s.wg.Add(2)
	go s.expireLoop()
	go s.hook.loop()
	return nil
}

// Close unsubscribes the service and stops its loops. It may be called more than once.
func (s *Service) Close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// nodeLocked returns the view of node, starting a new one when the node restarted. Caller holds
// s.mu.
func (s *Service) nodeLocked(node, boot string) *nodeView {
	v := s.nodes[node]
	if v != nil && v.boot != boot {
		s.dropNodeLocked(node, ReasonNodeRestarted)
		v = nil
	}
	if v == nil {
		v = &nodeView{name: node, id: s.sessions.names.acquire(node), boot: boot, seen: time.Now()}
		s.nodes[node] = v
	}
	return v
}

// dropNodeLocked forgets a node and its sessions, and queues their logouts with reason for
// emitLeaseEnds. Caller holds s.mu.
func (s *Service) dropNodeLocked(node, reason string) {
	v := s.nodes[node]
	if v == nil {
		return
	}
	end := endedNode{node: node, boot: v.boot, reason: reason, seq: v.seq, sessions: s.clearNodeLocked(v)}
	if len(end.sessions) > 0 {
		s.ended = append(s.ended, end)
	}
	s.sessions.names.release(v.id)
	delete(s.nodes, node)
}

// clearNodeLocked forgets a node's sessions and returns their logins. Caller holds s.mu.
func (s *Service) clearNodeLocked(v *nodeView) []*buspb.SessionEvent {
	if v.count == 0 {
		return nil
	}
	evs := s.sessions.removeNode(v.id)
	v.count = 0
	s.m.sessions.Set(float64(s.sessions.total))
	return evs
}

func (s *Service) addLocked(v *nodeView, ev *buspb.SessionEvent) {
	if s.sessions.add(v.id, v.name, ev) {
		v.count++
		s.m.sessions.Set(float64(s.sessions.total))
	}
}

func (s *Service) removeLocked(v *nodeView, id string) {
	if s.sessions.remove(v.id, v.name, id) != nil {
		v.count--
		s.m.sessions.Set(float64(s.sessions.total))
	}
}

// advanceLocked records that a node's stream reached seq and wakes the waiters. Caller holds s.mu.
func (s *Service) advanceLocked(v *nodeView, seq uint64) {
	v.seq = seq
	close(s.applied)
	s.applied = make(chan struct{})
}

// onStream applies one message of a node's session stream. Messages of one node arrive in order
// on this one subscription.
//
// A batch of events published with a trace context (the ChatLink's logins, with tracing on) is
// applied in a span, "presence apply", in that trace.
func (s *Service) onStream(msg *nats.Msg) {
	switch msg.Subject {
	case bus.SubjectPresenceEvents:
		_, span := bus.StartConsumer(msg, "presence apply")
		defer span.End()
		var evs buspb.SessionEvents
		if err := proto.Unmarshal(msg.Data, &evs); err != nil || evs.Node == "" {
			s.log.Warn("dropping session events that do not parse", "err", err)
			span.SetStatus(codes.Error, "does not parse")
			return
		}
		if span.IsRecording() {
			span.SetAttributes(attribute.String("roomcast.node", evs.Node), attribute.Int("messaging.batch.message_count", len(evs.Events)))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		v := s.nodeLocked(evs.Node, evs.Boot)
		if evs.Seq <= v.seq {
			return
		}
		for _, ev := range evs.Events {
			switch ev.Kind {
			case buspb.SessionEvent_KIND_LOGIN:
				s.addLocked(v, ev)
			case buspb.SessionEvent_KIND_LOGOUT:
				s.removeLocked(v, ev.SessionId)
			}
		}
		s.advanceLocked(v, evs.Seq)
	case bus.SubjectSessionsSnapshot:
		var snap buspb.NodeSnapshot
		if err := proto.Unmarshal(msg.Data, &snap); err != nil || snap.Node == "" {
			s.log.Warn("dropping session snapshot that does not parse", "err", err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		v := s.nodeLocked(snap.Node, snap.Boot)
		if snap.Seq <= v.seq {
			return
		}
		if v.snapSeq != snap.Seq {
			v.snapSeq, v.snap = snap.Seq, nil
		}
		v.snap = append(v.snap, snap.Sessions...)
		if !snap.Last {
			return
		}
		s.clearNodeLocked(v)
		for _, ev := range v.snap {
			s.addLocked(v, ev)
		}
		v.snap, v.snapSeq, v.mismatches = nil, 0, 0
		s.advanceLocked(v, snap.Seq)
	case bus.SubjectSessionsReport:
		var rep buspb.NodeReport
		if err := proto.Unmarshal(msg.Data, &rep); err != nil || rep.Node == "" {
			s.log.Warn("dropping node report that does not parse", "err", err)
			return
		}
		if !rep.Last {
			return // only the lease and the session count matter here
		}
		s.mu.Lock()
		v := s.nodeLocked(rep.Node, rep.Boot)
		v.seen = time.Now()
		resync := false
		if rep.Seq > v.seq {
			// The node counts the sessions its stream told, as this view does, so a count
			// that differs is drift (a lost message, a partition). Twice running: once may
			// be a connection that closed just before a snapshot, its logout still to come.
			if v.count != rep.Sessions {
				v.mismatches++
			} else {
				v.mismatches = 0
			}
			if v.mismatches >= 2 && time.Since(v.resyncAt) > time.Second {
				v.resyncAt, resync = time.Now(), true
			}
			s.advanceLocked(v, rep.Seq)
		}
		s.mu.Unlock()
		if resync {
			s.log.Info("session count drifted, asking for a snapshot", "node", rep.Node)
			if err := bus.Publish(s.cfg.Bus, bus.NodeSubject(rep.Node), &buspb.NodeControl{Op: buspb.NodeControl_OP_RESYNC}); err != nil {
				s.log.Warn("resync request not published", "err", err)
			}
		}
	}
}

// expireLoop drops the sessions of nodes whose lease ran out, and emits the logouts of the
// sessions dropped with a node (lease.go).
func (s *Service) expireLoop() {
	defer s.wg.Done()
	t := time.NewTicker(max(s.cfg.LeaseTTL/5, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			for name, v := range s.nodes {
				if now.Sub(v.seen) > s.cfg.LeaseTTL {
					s.log.Info("node lease expired, dropping its sessions", "node", name, "sessions", v.count)
					s.dropNodeLocked(name, ReasonLeaseEnded)
				}
			}
			ended := s.ended
			s.ended = nil
			s.mu.Unlock()
			for _, end := range ended {
				s.emitLeaseEnd(end)
			}
		}
	}
}

// waitApplied waits until this instance's view of node has taken in seq, or for a moment at
// most: the effects handler runs beside the stream handler and must decide on a view that
// includes the batch it acts on.
func (s *Service) waitApplied(node, boot string, seq uint64) {
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		v := s.nodes[node]
		done := v != nil && (v.boot != boot || v.seq >= seq)
		ch := s.applied
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			return
		case <-s.stop:
			return
		}
	}
}

// onEffects acts on a batch of session events once across all instances (a queue group): it
// publishes the app's online/offline events, queues them for the webhook, and applies the
// multi-device policy. A batch published with a trace context is handled in a span,
// "presence effects", in that trace, and the app's events and the kicks carry it on.
func (s *Service) onEffects(msg *nats.Msg) {
	ctx, span := bus.StartConsumer(msg, "presence effects")
	defer span.End()
	var evs buspb.SessionEvents
	if err := proto.Unmarshal(msg.Data, &evs); err != nil {
		span.SetStatus(codes.Error, "does not parse")
		return
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.String("roomcast.node", evs.Node), attribute.Int("messaging.batch.message_count", len(evs.Events)))
	}
	s.publishEvents(ctx, evs.Events)
	s.waitApplied(evs.Node, evs.Boot, evs.Seq)
	for _, ev := range evs.Events {
		if ev.Kind == buspb.SessionEvent_KIND_LOGIN {
			s.enforcePolicy(ctx, ev)
		}
	}
}

// publishEvents publishes session events on their apps' subjects, with ctx's trace context,
// and queues them for the apps' webhooks.
func (s *Service) publishEvents(ctx context.Context, evs []*buspb.SessionEvent) {
	byApp := make(map[string][]*buspb.SessionEvent)
	for _, ev := range evs {
		byApp[ev.App] = append(byApp[ev.App], ev)
	}
	for app, list := range byApp {
		if err := bus.PublishTraced(ctx, s.cfg.Bus, bus.AppEventsSubject(app), &buspb.SessionEvents{Events: list}); err != nil {
			s.log.Warn("app events not published", "app", app, "events", len(list), "err", err)
		}
		s.hook.add(app, list)
	}
	s.m.countEvents(evs)
}

// enforcePolicy closes the sessions a login replaces under its app's policy; the kicks carry
// ctx's trace context.
//
// Each node publishes its events on its own clock (every 100 ms), so a user's login on one
// node may reach presence before an older login on another: the policy is applied to all of
// the user's sessions as they stand, and the login closes what it replaces and also itself
// when a newer session already replaces it. Newer sessions are left to their own login.
func (s *Service) enforcePolicy(ctx context.Context, login *buspb.SessionEvent) {
	p, ok := s.cfg.Policies[login.App]
	if !ok || (p.MaxSessions <= 0 && !p.OnePerDevice) {
		return
	}
	s.mu.Lock()
	all := s.sessions.user(login.App, login.Uid)
	s.mu.Unlock()
	live := slices.ContainsFunc(all, func(ev *buspb.SessionEvent) bool { return ev.SessionId == login.SessionId })
	if !live {
		return // gone already
	}
	sortByTime(all) // oldest first
	atOrBefore := func(ev *buspb.SessionEvent) bool { return byTime(ev, login) <= 0 }
	newest := all[len(all)-1]
	for _, ev := range p.replaced(all) {
		if !atOrBefore(ev) {
			continue
		}
		req := &buspb.NodeControl{
			Op: buspb.NodeControl_OP_KICK, App: ev.App, Sessions: []string{ev.SessionId},
			CloseCode: uint32(clientpb.CloseCode_CLOSE_CODE_REPLACED), Reason: "replaced by a newer session on " + newest.Device,
		}
		if err := bus.PublishTraced(ctx, s.cfg.Bus, bus.NodeSubject(ev.Node), req); err != nil {
			s.log.Warn("replace kick not published", "session", ev.SessionId, "err", err)
			continue
		}
		s.m.replaced.Inc()
	}
}

// replaced returns the sessions of one user, all sorted oldest first, that the policy closes:
// with OnePerDevice each but the newest on its device; with MaxSessions the oldest beyond the
// limit (those closed for their device count towards it).
func (p DevicePolicy) replaced(all []*buspb.SessionEvent) []*buspb.SessionEvent {
	var out []*buspb.SessionEvent
	if p.OnePerDevice {
		for i, ev := range all {
			if slices.ContainsFunc(all[i+1:], func(e *buspb.SessionEvent) bool { return e.Device == ev.Device }) {
				out = append(out, ev)
			}
		}
	}
	if over := len(all) - p.MaxSessions; p.MaxSessions > 0 && over > 0 {
		for _, ev := range all[:over] {
			if !slices.Contains(out, ev) {
				out = append(out, ev)
			}
		}
	}
	return out
}

// byTime orders sessions by login time, then by id.
func byTime(a, b *buspb.SessionEvent) int {
	return cmp.Or(cmp.Compare(a.TimeMs, b.TimeMs), strings.Compare(a.SessionId, b.SessionId))
}

func sortByTime(evs []*buspb.SessionEvent) { slices.SortFunc(evs, byTime) }

// onCount answers the sessions and distinct users online in an app.
func (s *Service) onCount(msg *nats.Msg) {
	var q buspb.PresenceQuery
	if err := proto.Unmarshal(msg.Data, &q); err != nil || q.App == "" {
		bus.Respond(s.log, msg, &buspb.PresenceReply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request needs an app"})
		return
	}
	rep := &buspb.PresenceReply{}
	s.mu.Lock()
	rep.SessionsOnline, rep.UsersOnline = s.sessions.count(q.App)
	s.mu.Unlock()
	bus.Respond(s.log, msg, rep)
}

// onSessions answers the sessions of the uids asked for.
func (s *Service) onSessions(msg *nats.Msg) {
	var q buspb.PresenceQuery
	if err := proto.Unmarshal(msg.Data, &q); err != nil || q.App == "" {
		bus.Respond(s.log, msg, &buspb.PresenceReply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request needs an app"})
		return
	}
	rep := &buspb.PresenceReply{}
	s.mu.Lock()
	for _, uid := range q.Uids {
		rep.Sessions = append(rep.Sessions, s.sessions.user(q.App, uid)...)
	}
	s.mu.Unlock()
	sortByTime(rep.Sessions)
	bus.Respond(s.log, msg, rep)
}

// Sessions returns how many sessions this instance knows of, for tests and metrics.
func (s *Service) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.sessions.total)
}

// LeaseEndLogouts returns how many logouts of sessions whose node is gone this instance emitted,
// and how many it left to the instance that claimed the node's end first.
func (s *Service) LeaseEndLogouts() (emitted, skipped int64) {
	return s.leaseEndsEmitted.Load(), s.leaseEndsSkipped.Load()
}
