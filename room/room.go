// Package room is the room service: it admits members into rooms (or refuses them: closed room,
// banned user, full room), checks and stamps every message (id, server time) and broadcasts it on
// the room's subject to the ChatLinks that hold members, and knows how many members each room has
// on each node. An app with callbacks (package callback) has the last word on the logins and the
// members' sends admitted here. It does not serve app backends: the server API (package api)
// writes the rooms' store (store/roomstore) and asks this service over NATS.
//
// Rooms and member restrictions (mute, ban) live in JetStream KV (store/roomstore); each
// instance watches the buckets (cache.go), so checks on the hot path read memory. Membership is
// owned by the ChatLinks: their reports tell every instance the members per room and node
// (distribution.go), and member lists are asked of the nodes by the server API. Any number of
// instances share the work in a queue group; none holds state that only it has.
//
// A room in CDN mode has a route, written by the CDN manager (cdn.go): its CDN lanes go to the
// pusher that route names instead of the room's subject. The service does not decide the mode
// or the pusher.
//
// It keeps the rooms' critical and normal messages in a JetStream stream (history.go; the
// stream and its records are defined in store/historystore) and answers pages of it, with each
// room's retention and what a member may see (historyquery.go), for the server API and for
// members through their ChatLink.
package room

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"roomcast/callback"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/internal/tracing"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/attrstore"
	"roomcast/store/historystore"
	"roomcast/store/roomstore"
	"roomcast/tag"
)

// exprCacheSize bounds the compiled tag expressions a service instance keeps.
const exprCacheSize = 4096

// ReservedTypePrefix starts the message types of Roomcast's own messages (the room queue's
// "rc.queue"): members may not send them, so a client can trust them.
const ReservedTypePrefix = "rc."

// Config configures a room service instance.
type Config struct {
	// Bus is the NATS connection. Required; its server must have JetStream.
	Bus *nats.Conn
	// Log receives the service's logs. Zero value means none.
	Log *slog.Logger
	// Queue is the NATS queue group instances share. Zero value means "room".
	Queue string
	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
	// LeaseTTL is how long a node's members outlive its last report. Zero value means 5s.
	LeaseTTL time.Duration
	// RequireCreated refuses logins and sends to rooms that were never created. Zero value
	// means such a room opens implicitly, with default settings, at its first login.
	RequireCreated bool
	// KVReplicas is the replication of the KV buckets and of the history streams (3 suits a
	// cluster). Zero value means 1.
	KVReplicas int
	// HistoryPerRoom is how many of a room's critical and normal messages are kept for
	// recovery after a reconnect (for 24 hours at most). The stream, which all instances share,
	// keeps that many of a room's windows (records of one message or more) and readers the
	// newest that many messages of them; the last instance to start sets the stream's limit,
	// each record says its writer's (historystore.RecordHeader). Zero value means
	// historystore.PerRoom (100). A room's settings may keep fewer
	// (RoomSettings.history_max_messages).
	HistoryPerRoom int
	// BatchWindow is how long the instance gathers a room's messages before it numbers them and
	// sends them to the room's nodes as one RoomBatch (batcher.go). A send is answered when it is
	// accepted, before its window ends. Zero value means DefaultBatchWindow (20ms); a negative
	// one sends each request's messages at once and answers after the publish.
	BatchWindow time.Duration
	// BulkPerSecond caps the bulk messages a room passes to the bus per second, for rooms whose
	// settings do not set bulk_per_second (bulkcap.go). Zero value means DefaultBulkPerSecond
	// (200); a negative one means no cap.
	BulkPerSecond int
	// Registerer receives the instance's metrics (roomcast_room_*). Zero value means none are
	// registered.
	Registerer prometheus.Registerer
	// HistoryMaxAge is how long the history keeps a message, a setting of the stream like
	// HistoryPerRoom. A room's settings may keep them for less (RoomSettings.history_max_age_s).
	// Zero value means 24h.
	HistoryMaxAge time.Duration
	// Callbacks asks the apps' backends about the logins and the members' sends the service
	// admitted (callbacks.go); several instances may share one. Zero value means none.
	Callbacks *callback.Client
	// MemberSendsPerSecond caps the messages a room's members send per second, all of them
	// together, on every lane (bursts of twice that): a send over it is refused with 120
	// (SEND_RATE_LIMITED) and a retry hint (membersend.go). The cap is per instance, like
	// BulkPerSecond. The app server's sends are not counted. Zero value means
	// DefaultMemberSendsPerSecond (1000); a negative one means no cap.
	MemberSendsPerSecond int
	// MemberCriticalPerSecond caps the critical messages a room's members send per second, as
	// MemberSendsPerSecond does, for rooms whose settings do not set member_critical_per_second.
	// Zero value means DefaultMemberCriticalPerSecond (10); a negative one means no cap.
	MemberCriticalPerSecond int
	// MemberAttributesPerSecond caps the attribute changes a room's members make per second
	// (SetAttribute frames, attributes.go), all of them together, bursts of twice that; over it
	// a change is refused with 120 (SEND_RATE_LIMITED) and a retry hint. Per instance. Zero
	// value means DefaultMemberAttributesPerSecond (5); a negative one means no cap.
	MemberAttributesPerSecond int
	// CounterTick is how long the instance gathers a room's counter windows before it writes
	// them to the store and broadcasts the room's totals (counters.go). Zero value means
	// DefaultCounterTick (250ms).
	CounterTick time.Duration
}

// Service is one instance of the room service.
type Service struct {
	cfg      Config
	log      *slog.Logger // cfg.Log, naming the service
	ids      ids.Generator
	subs     []*nats.Subscription
	store    *roomstore.Store
	cache    *cache
	dist     *distribution
	hist     *history
	cdn      *cdnRoutes
	exprs    *tag.Cache // tag expressions checked, compiled once
	batch    *batcher   // nil when Config.BatchWindow is negative
	bulk     *bulkCap
	members  memberRates
	metrics  *metrics
	counters *counters
	attrs    *attrstore.Store // the rooms' attributes, read for a node's first login of a room

	stop    chan struct{}
	closing atomic.Bool    // Close has begun: SendLocalQueued takes no more sends
	wg      sync.WaitGroup // the expiry loop
	once    sync.Once
}

// withDefaults returns c with the zero values replaced by the documented defaults, or an error
// for a Config New cannot use.
func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("room: Config.Bus is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Queue == "" {
		c.Queue = "room"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.KVReplicas <= 0 {
		c.KVReplicas = 1
	}
	if c.HistoryPerRoom <= 0 {
		c.HistoryPerRoom = historystore.PerRoom
	}
	if c.BatchWindow == 0 {
		c.BatchWindow = DefaultBatchWindow
	}
	if c.BulkPerSecond == 0 {
		c.BulkPerSecond = DefaultBulkPerSecond
	}
	if c.HistoryMaxAge <= 0 {
		c.HistoryMaxAge = DefaultHistoryMaxAge
	}
	if c.MemberSendsPerSecond == 0 {
		c.MemberSendsPerSecond = DefaultMemberSendsPerSecond
	}
	if c.MemberCriticalPerSecond == 0 {
		c.MemberCriticalPerSecond = DefaultMemberCriticalPerSecond
	}
	if c.MemberAttributesPerSecond == 0 {
		c.MemberAttributesPerSecond = DefaultMemberAttributesPerSecond
	}
	if c.CounterTick <= 0 {
		c.CounterTick = DefaultCounterTick
	}
	return c, nil
}

// New returns a room service; Start subscribes it.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Log.With("svc", "room"), dist: newDistribution(), exprs: tag.NewCache(exprCacheSize),
		bulk: newBulkCap(), members: newMemberRates(), metrics: newMetrics(cfg.Registerer), stop: make(chan struct{})}
	if cfg.BatchWindow > 0 {
		s.batch = newBatcher(s, cfg.BatchWindow)
	}
	return s, nil
}

// Start opens the KV buckets, loads them, and subscribes the service to its subjects.
func (s *Service) Start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if s.store, err = roomstore.OpenStore(ctx, s.cfg.Bus, s.cfg.KVReplicas); err != nil {
		return err
	}
	if s.cache, err = watch(ctx, s.store, s.log); err != nil {
		return err
	}
	if s.hist, err = openHistory(ctx, s.cfg.Bus, s.cfg.KVReplicas, s.cfg.HistoryPerRoom, s.cfg.HistoryMaxAge, s.log); err != nil {
		s.cache.stop()
		return err
	}
	if s.cdn, err = openCdnRoutes(ctx, s); err != nil {
		s.cache.stop()
		return err
	}
	if s.counters, err = s.openCounters(ctx); err != nil {
		s.cache.stop()
		s.cdn.stop()
		return err
	}
	if s.attrs, err = attrstore.Open(ctx, s.cfg.Bus, s.cfg.KVReplicas); err != nil {
		s.cache.stop()
		s.cdn.stop()
		return err
	}
	sub, err := s.cfg.Bus.Subscribe(bus.SubjectSessionsReport, s.dist.onReport)
	if err != nil {
		s.Close()
		return fmt.Errorf("room: subscribe %s: %w", bus.SubjectSessionsReport, err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	s.subs = append(s.subs, sub)
	handlers := map[string]nats.MsgHandler{
		bus.SubjectRoomJoin:       s.onJoin,
		bus.SubjectRoomSend:       s.onSend,
		bus.SubjectRoomSendBatch:  s.onSendBatch,
		bus.SubjectRoomInfo:       s.onInfo,
		bus.SubjectRoomHistory:    s.onHistory,
		bus.SubjectRoomCounters:   s.onCounters,
		bus.SubjectRoomViewers:    s.onViewers,
		bus.SubjectRoomModerate:   s.onModerate,   // moderate.go
		bus.SubjectRoomAttributes: s.onAttributes, // attributes.go
		bus.SubjectRoomRecall:     s.onRecall,     // recall.go
	}
	for subject, h := range handlers {
		sub, err := s.cfg.Bus.QueueSubscribe(subject, s.cfg.Queue, h)
		if err != nil {
			s.Close()
			return fmt.Errorf("room: subscribe %s: %w", subject, err)
		}
		s.subs = append(s.subs, sub)
	}
	s.wg.Add(2)
	go s.expireLoop()
	go s.countersLoop()
	return s.cfg.Bus.Flush()
}

// Close unsubscribes the service, sends the messages still in their batch window and stops
// watching the KV buckets. It may be called more than once.
func (s *Service) Close() {
	s.closing.Store(true)
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
	if s.batch != nil {
		s.batch.close()
	}
	s.once.Do(func() {
		close(s.stop)
		if s.cache != nil {
			s.cache.stop()
		}
		if s.cdn != nil {
			s.cdn.stop()
		}
	})
	s.wg.Wait()
}

func (s *Service) expireLoop() {
	defer s.wg.Done()
	t := time.NewTicker(max(s.cfg.LeaseTTL/5, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.dist.expire(now, s.cfg.LeaseTTL)
			s.bulk.expire(now)
		}
	}
}

func refuse(code clientpb.ErrorCode, close clientpb.CloseCode, msg string) *buspb.Reply {
	return &buspb.Reply{Code: uint32(code), CloseCode: uint32(close), Message: msg}
}

// admit decides a login into the room meta describes (nil: never created): nil lets it in,
// otherwise the refusal.
func (s *Service) admit(req *buspb.JoinRequest, meta *apipb.Room, now time.Time) *buspb.Reply {
	switch {
	case meta == nil && s.cfg.RequireCreated:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED, "room does not exist")
	case meta != nil && meta.Status == apipb.RoomStatus_ROOM_STATUS_CLOSED:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED, "room is closed")
	}
	if r := s.cache.restriction(req.App, req.Room, req.Uid); bannedAt(r, now) {
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, clientpb.CloseCode_CLOSE_CODE_BANNED, "banned from this room")
	}
	if limit := meta.GetSettings().GetMaxMembers(); limit > 0 && s.dist.online(req.App, req.Room) >= limit {
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, clientpb.CloseCode_CLOSE_CODE_ROOM_FULL, "room is full")
	}
	return nil
}

// storeReadTimeout bounds a read of the store on a join's path.
const storeReadTimeout = 2 * time.Second

func (s *Service) onJoin(msg *nats.Msg) {
	start := time.Now()
	_, span := bus.StartServer(msg, "room join")
	defer span.End()
	var req buspb.JoinRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opJoin, start, rep)
		return
	}
	meta := s.cache.room(req.App, req.Room)
	if meta == nil && s.cfg.RequireCreated {
		// The cache follows the store a little behind: a room created a moment ago through
		// another instance may not be in it yet, so a miss is asked of the store.
		ctx, cancel := context.WithTimeout(context.Background(), storeReadTimeout)
		r, _, err := s.store.Room(ctx, req.App, req.Room)
		cancel()
		if err != nil {
			s.log.Warn("room read on a cache miss", "app", req.App, "room", req.Room, "err", err)
		}
		meta = r
	}
	if rep := s.admit(&req, meta, s.cfg.Now()); rep != nil {
		s.respond(msg, opJoin, start, rep)
		return
	}
	if s.loginCallback(msg, start, &req, meta) { // the app's backend decides, and callbacks.go answers
		return
	}
	s.answerJoin(msg, start, &req, meta, nil)
}

// answerJoin answers an admitted login with what its ChatLink needs; tags, when not nil, are
// the member's (from the app's login callback).
func (s *Service) answerJoin(msg *nats.Msg, start time.Time, req *buspb.JoinRequest, meta *apipb.Room, tags *roompb.MemberTags) {
	settings := meta.GetSettings()
	route := s.cdn.get(req.App, req.Room)
	var (
		counters *clientpb.CounterTotals
		attrs    *clientpb.RoomAttributes
		recalls  *clientpb.Recall
	)
	if req.FirstOnNode {
		// The cache follows the store a little behind; the node's copy of the settings (and
		// of the CDN config) is kept current from here on by the announcements of changes
		// (API.announceSettings, the CDN manager's).
		ctx, cancel := context.WithTimeout(context.Background(), storeReadTimeout)
		r, _, err := s.store.Room(ctx, req.App, req.Room)
		if err == nil {
			settings = r.GetSettings()
		} else {
			s.log.Warn("room settings read from the cache", "app", req.App, "room", req.Room, "err", err)
		}
		if route, err = s.cdn.fresh(ctx, req.App, req.Room); err != nil {
			s.log.Warn("CDN route read from the cache", "app", req.App, "room", req.Room, "err", err)
		}
		// The node keeps the room's counters current from the broadcasts after each write.
		counters = s.counterTotals(ctx, req.App, req.Room)
		// And its attributes from the store, kept current by the API's broadcasts of changes.
		if attrs, err = s.attrs.Get(ctx, req.App, req.Room); err != nil {
			s.log.Warn("room attributes not read for a join", "app", req.App, "room", req.Room, "err", err)
		}
		// A room in CDN mode: its recent recalls, for the node to repeat to its logins (the
		// first segment a new client polls may hold a recalled message; room/recall.go).
		if route.GetConfig().GetMode() != clientpb.CdnMode_CDN_MODE_OFF {
			recent, err := historystore.Recalls(ctx, s.hist.js, req.App, req.Room, s.cfg.Now().Add(-historystore.RecentRecallAge))
			if err != nil {
				s.log.Warn("recent recalls not read for a join", "app", req.App, "room", req.Room, "err", err)
			}
			if len(recent) > 0 {
				recalls = &clientpb.Recall{Messages: recent}
			}
		}
		cancel()
	}
	s.respond(msg, opJoin, start, &buspb.Reply{
		Settings:      settings,
		MemberTags:    cmp.Or(tags, s.cache.memberTags(req.App, req.Uid)),
		Cdn:           route.GetConfig(),
		Counters:      counters,
		Viewers:       []*buspb.RoomCount{s.dist.viewers(req.App, req.Room)},
		Attributes:    attrs,
		RecentRecalls: recalls,
	})
}

func (s *Service) onInfo(msg *nats.Msg) {
	var req buspb.JoinRequest // only app and room are read
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	bus.Respond(s.log, msg, &buspb.Reply{Room: s.dist.info(req.App, req.Room)})
}

// maysend decides whether a send may go to the room: nil lets it, otherwise the refusal. A send
// without a session comes from the app server, which mutes do not stop.
func (s *Service) maySend(req *buspb.SendRequest, now time.Time) *buspb.Reply {
	meta := s.cache.room(req.App, req.Room)
	switch {
	case meta == nil && s.cfg.RequireCreated:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room does not exist")
	case meta != nil && meta.Status == apipb.RoomStatus_ROOM_STATUS_CLOSED:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room is closed")
	case req.SessionId != "" && strings.HasPrefix(req.Type, ReservedTypePrefix):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "message types starting with "+ReservedTypePrefix+" are Roomcast's own")
	case req.SessionId == "":
		return nil
	case meta.GetMuted():
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "room is muted")
	case meta.GetSettings().GetWhoMaySend() == roompb.SendPolicy_SEND_POLICY_APP:
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "only the app may send to this room")
	case meta.GetSettings().GetWhoMaySend() == roompb.SendPolicy_SEND_POLICY_OWNER && req.Uid != meta.GetOwner():
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "only the room's owner may send")
	}
	r := s.cache.restriction(req.App, req.Room, req.Uid)
	switch {
	case bannedAt(r, now):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "banned from this room")
	case mutedAt(r, now):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "muted in this room")
	case tagMuted(meta, req.SenderTags, req.Uid, now, s.exprs):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "members with your tags are muted in this room")
	}
	if rep := s.scopeByTags(req, meta.GetSettings()); rep != nil {
		return rep
	}
	return s.checkLane(req, meta.GetSettings())
}

// scopeByTags applies a room's tag permissions to a member's message: send_expr says who may
// send, broadcast_expr who may send to everyone or choose an audience; any other sender's
// message is narrowed to the members sharing its scope_prefix tags. It returns the refusal, or
// nil (possibly with req.TagExpr set).
func (s *Service) scopeByTags(req *buspb.SendRequest, st *roompb.RoomSettings) *buspb.Reply {
	allowed := func(src string) bool {
		e, err := s.exprs.Get(src)
		return err == nil && e.EvalTags(req.SenderTags, req.Uid)
	}
	forbid := func(msg string) *buspb.Reply { return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, msg) }
	switch {
	case st.GetSendExpr() != "" && !allowed(st.GetSendExpr()):
		return forbid("you may not send in this room")
	case st.GetBroadcastExpr() == "" || allowed(st.GetBroadcastExpr()):
		return nil
	case req.TagExpr != "":
		return forbid("you may not choose who receives your messages in this room")
	case st.GetScopePrefix() == "":
		return forbid("only some members may send in this room")
	}
	var scope []string
	for _, t := range req.SenderTags {
		if strings.HasPrefix(t, st.GetScopePrefix()) {
			scope = append(scope, strconv.Quote(t)+" in tags")
		}
	}
	if len(scope) == 0 {
		return forbid("you have no " + st.GetScopePrefix() + " tag to send to")
	}
	req.TagExpr = strings.Join(scope, " || ")
	return nil
}

func (s *Service) onSend(msg *nats.Msg) {
	start := time.Now()
	ctx, span := bus.StartServer(msg, "room send")
	defer span.End()
	var req buspb.SendRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opSend, start, rep)
		return
	}
	if req.SessionId != "" {
		s.memberSend(ctx, msg, start, &req) // membersend.go
		return
	}
	s.sendAndRespond(ctx, msg, start, []*buspb.SendRequest{&req})
}

func (s *Service) onSendBatch(msg *nats.Msg) {
	start := time.Now()
	var req buspb.SendBatchRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opSend, start, rep)
		return
	}
	limit := roomstore.MaxBatch
	if req.Members {
		limit = roomstore.MaxMemberBatch
	}
	if rep := checkBatch(req.Sends, limit); rep != nil {
		s.respond(msg, opSend, start, rep)
		return
	}
	if req.Members {
		ctx, span := bus.StartServer(msg, "room send")
		defer span.End()
		s.memberBatch(ctx, msg, start, req.Sends) // membersend.go
		return
	}
	s.sendAndRespond(context.Background(), msg, start, req.Sends)
}

// checkBatch refuses a batch send of no messages, more than limit, or to more than one room.
func checkBatch(reqs []*buspb.SendRequest, limit int) *buspb.Reply {
	if n := len(reqs); n == 0 || n > limit {
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, fmt.Sprintf("a batch holds 1 to %d messages, not %d", limit, n))
	}
	for _, r := range reqs[1:] {
		if r.App != reqs[0].App || r.Room != reqs[0].Room {
			return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "a batch goes to one room")
		}
	}
	return nil
}

// SendLocalQueued takes the server API's sends to one room from the same process, without the
// NATS request and reply: it checks, stamps and hands them on exactly as a request on
// SubjectRoomSend (one send) or SubjectRoomSendBatch (several) would, before it returns, so
// sends queued one after the other reach the room in that order (the API's SendStream). The
// Queued it returns gives the reply that request would get (a critical send's, once its window
// is published); its Reply must be called once. It reports false, having done nothing, when the
// service has not started or has begun to close (the caller then asks over NATS), and for a
// send with a session: a member's sends may be called back to its app (callbacks.go) and go
// over NATS.
func (s *Service) SendLocalQueued(ctx context.Context, reqs []*buspb.SendRequest) (q *Queued, ok bool) {
	start := time.Now()
	if s.cache == nil || s.closing.Load() || slices.ContainsFunc(reqs, func(r *buspb.SendRequest) bool { return r.SessionId != "" }) {
		return nil, false
	}
	ctx, span := tracing.Start(ctx, "room send", trace.SpanKindInternal)
	q = &Queued{s: s, traceparent: bus.TraceparentFrom(ctx), span: span, start: start, rep: checkBatch(reqs, roomstore.MaxBatch)}
	if q.rep == nil {
		q.rep, q.w = s.send(ctx, reqs)
	}
	return q, true
}

// Queued is the outcome of sends SendLocalQueued took.
type Queued struct {
	s           *Service
	traceparent string // the send's, for the log of its answer
	span        trace.Span
	start       time.Time
	rep         *buspb.Reply
	w           *windowDone // the window a critical send waits for; nil when rep is the answer
}

// Waits reports whether Reply waits for the sends' window to be published (a critical send
// under a batch window); otherwise it returns at once.
func (q *Queued) Waits() bool { return q.w != nil }

// Reply returns the reply, once it is known. Call it once.
func (q *Queued) Reply() *buspb.Reply {
	defer q.span.End()
	if q.w != nil {
		q.rep = q.w.reply(q.rep)
	}
	q.s.answered(q.traceparent, opSend, q.start, q.rep)
	return q.rep
}

// send checks and stamps messages to one room and hands them to the broadcast: all of them, as
// one room batch, or none. It returns the reply, or, for a send holding a critical message
// under a batch window, the reply to give once the window it returns is published (w.reply):
// a critical send is answered only when its messages are numbered, kept and published, and 503
// when they were not. Bulk and normal sends are answered on acceptance (batcher.go).
func (s *Service) send(ctx context.Context, reqs []*buspb.SendRequest) (*buspb.Reply, *windowDone) {
	now := s.cfg.Now()
	for i, req := range reqs {
		if rep := s.check(req, now); rep != nil {
			if len(reqs) > 1 {
				rep.Message = fmt.Sprintf("message %d: %s", i, rep.Message)
			}
			return rep, nil
		}
	}
	return s.accept(ctx, reqs, now)
}

// check is ValidateSend and maySend: nil when req may go to its room (its audience possibly
// narrowed, its lane possibly lowered), otherwise the refusal.
func (s *Service) check(req *buspb.SendRequest, now time.Time) *buspb.Reply {
	if rep := ValidateSend(req, s.exprs); rep != nil {
		return rep
	}
	return s.maySend(req, now)
}

// accept stamps checked messages to one room and hands them to the broadcast, as send
// describes.
func (s *Service) accept(ctx context.Context, reqs []*buspb.SendRequest, now time.Time) (*buspb.Reply, *windowDone) {
	s.metrics.sendBatch.Observe(float64(len(reqs)))
	batch := s.stamp(reqs, now)
	rep := &buspb.Reply{ServerTimeMs: now.UnixMilli(), MessageIds: make([]string, len(batch.Messages))}
	for i, m := range batch.Messages {
		rep.MessageIds[i] = m.Id
	}
	if len(reqs) == 1 {
		rep.MessageId = rep.MessageIds[0]
	}
	app, room := reqs[0].App, reqs[0].Room
	s.metrics.accepted.Add(float64(len(batch.Messages)))
	var sampled int
	rate := s.bulkRate(s.cache.room(app, room).GetSettings())
	batch.Messages, batch.SenderSessions, sampled = s.bulk.keep(roomKey{app, room}, rate, s.cdn.get(app, room), now, batch.Messages, batch.SenderSessions)
	s.metrics.bulkSampled.Add(float64(sampled))
	critical := slices.ContainsFunc(batch.Messages, func(m *clientpb.Message) bool { return m.Lane == clientpb.Lane_LANE_CRITICAL })
	switch {
	case len(batch.Messages) == 0:
	case s.batch != nil && critical:
		return rep, s.batch.add(app, room, batch, trace.SpanContextFromContext(ctx))
	case s.batch != nil:
		s.batch.add(app, room, batch, trace.SpanContextFromContext(ctx))
	case s.broadcast(app, room, batch, linkTo(nil, trace.SpanContextFromContext(ctx))) != nil:
		return notSent(), nil
	}
	return rep, nil
}

// notSent is the reply to a send whose messages were not broadcast.
func notSent() *buspb.Reply {
	return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "broadcast failed; the messages were not sent")
}

// sendAndRespond sends reqs and answers msg: at once, or, for a send holding a critical message,
// from a goroutine once its window is published, so that the subscription goes on taking
// sends meanwhile.
func (s *Service) sendAndRespond(ctx context.Context, msg *nats.Msg, start time.Time, reqs []*buspb.SendRequest) {
	rep, w := s.send(ctx, reqs)
	s.respondSent(msg, start, rep, w)
}

// respondSent answers msg with rep, at once or, when w is not nil, once w is published.
func (s *Service) respondSent(msg *nats.Msg, start time.Time, rep *buspb.Reply, w *windowDone) {
	if w == nil {
		s.respond(msg, opSend, start, rep)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.respond(msg, opSend, start, w.reply(rep))
	}()
}

// sendThen sends reqs and calls answer with the reply once it is known: at once, or, for a
// send holding a critical message, from a goroutine once its window is published.
func (s *Service) sendThen(ctx context.Context, reqs []*buspb.SendRequest, answer func(*buspb.Reply)) {
	rep, w := s.send(ctx, reqs)
	s.answerWhen(rep, w, answer)
}

// acceptThen is sendThen for checked requests (accept).
func (s *Service) acceptThen(ctx context.Context, reqs []*buspb.SendRequest, now time.Time, answer func(*buspb.Reply)) {
	rep, w := s.accept(ctx, reqs, now)
	s.answerWhen(rep, w, answer)
}

// answerWhen calls answer with rep, at once or, when w is not nil, once w is published.
func (s *Service) answerWhen(rep *buspb.Reply, w *windowDone, answer func(*buspb.Reply)) {
	if w == nil {
		answer(rep)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		answer(w.reply(rep))
	}()
}

// stamp turns accepted send requests into the room's messages: an id, the server time (which
// broadcast sets again when they leave) and the normal lane when none was named.
func (s *Service) stamp(reqs []*buspb.SendRequest, now time.Time) *buspb.RoomBatch {
	batch := &buspb.RoomBatch{Messages: make([]*clientpb.Message, len(reqs)), SenderSessions: make([]string, len(reqs))}
	for i, req := range reqs {
		m := &clientpb.Message{
			Id:           s.ids.New(now),
			Room:         req.Room,
			Sender:       req.Uid,
			Type:         req.Type,
			Lane:         req.Lane,
			TagExpr:      req.TagExpr,
			Body:         req.Body,
			ServerTimeMs: now.UnixMilli(),
		}
		if m.Lane == clientpb.Lane_LANE_UNSPECIFIED {
			m.Lane = clientpb.Lane_LANE_NORMAL
		}
		batch.Messages[i], batch.SenderSessions[i] = m, req.SessionId
	}
	return batch
}

// ValidateSend checks a send request against the room's limits (roomstore.CheckSend) and its
// tag expression. It returns nil when the request is acceptable, otherwise the reply to give.
// exprs caches compiled tag expressions.
func ValidateSend(req *buspb.SendRequest, exprs *tag.Cache) *buspb.Reply {
	if rep := roomstore.CheckSend(req); rep != nil {
		return rep
	}
	if req.TagExpr != "" {
		if _, err := exprs.Get(req.TagExpr); err != nil {
			return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR), Message: err.Error()}
		}
	}
	return nil
}

// decode unmarshals a request, or returns the reply that refuses it.
func decode(msg *nats.Msg, into proto.Message) *buspb.Reply {
	if err := proto.Unmarshal(msg.Data, into); err != nil {
		return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request does not parse"}
	}
	return nil
}
