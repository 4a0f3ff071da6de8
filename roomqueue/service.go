// Package roomqueue is the room queue service: each room's ordered key/value queue (mic order,
// grab the mic), kept in JetStream KV and changed only by compare-and-set, so that any number of
// instances can serve it and two offers of one key never both win. Every change is numbered
// (QueueState.version) and broadcast to the room as a critical message of type "rc.queue"
// through the room service, like a message from the app server. Members reach it through their
// ChatLink (client frames RoomQueueRequest / RoomQueueReply), app servers through the server
// API; both arrive as QueueBusRequests on rc.svc.queue.
//
// Entries offered with drop_on_leave go when their session ends: the service follows the
// presence service's logouts (the ChatLinks' own and those of nodes whose lease ended) and an
// index of such sessions built by watching the bucket (leave.go).
//
// It keeps no state that only one instance has, and it does not decide who is in a room: the
// room's settings (queue_expr, queue_admin_expr) and the member's tags as its ChatLink gives
// them do.
package roomqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/roomstore"
	"roomcast/tag"
)

// Limits of what the service accepts, whatever its Config says.
const (
	// LimitValueBytes bounds Config.MaxValueBytes: an offer's event, with its value, must fit
	// in a room message (roomstore.MaxBodyBytes).
	LimitValueBytes = 8 << 10
	// LimitEntries bounds Config.MaxEntries: a queue is one KV value.
	LimitEntries = 1000
)

// The defaults of Config.MaxEntries and MaxValueBytes, and of `roomcast services`' flags.
const (
	DefaultMaxEntries    = 100
	DefaultMaxValueBytes = 1024
)

// Config configures a room queue service instance.
type Config struct {
	// Bus is the NATS connection. Required; its server must have JetStream.
	Bus *nats.Conn
	// Log receives the service's logs. Zero value means none.
	Log *slog.Logger
	// Queue is the NATS queue group instances share. Zero value means "roomqueue".
	Queue string
	// KVReplicas is the replication of the queues' KV bucket. Zero value means 1.
	KVReplicas int
	// MaxEntries is the most entries a room's queue holds (a room's queue_max_entries may set
	// fewer). Zero value means DefaultMaxEntries (100); at most LimitEntries.
	MaxEntries int
	// MaxValueBytes bounds an entry's value. Zero value means DefaultMaxValueBytes (1024); at
	// most LimitValueBytes.
	MaxValueBytes int
	// Timeout bounds the work of one request: reads and writes of KV, the broadcast. Zero
	// value means 2s.
	Timeout time.Duration
	// Workers is how many requests an instance serves at once. Zero value means 64.
	Workers int
	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
	// Registerer receives the service's metrics (roomcast_roomqueue_*). Zero value means they
	// are not registered.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("roomqueue: Config.Bus is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Queue == "" {
		c.Queue = "roomqueue"
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.MaxValueBytes <= 0 {
		c.MaxValueBytes = DefaultMaxValueBytes
	}
	switch {
	case c.MaxEntries > LimitEntries:
		return c, fmt.Errorf("roomqueue: MaxEntries %d is over the limit of %d", c.MaxEntries, LimitEntries)
	case c.MaxValueBytes > LimitValueBytes:
		return c, fmt.Errorf("roomqueue: MaxValueBytes %d is over the limit of %d", c.MaxValueBytes, LimitValueBytes)
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Service is one instance of the room queue service.
type Service struct {
	cfg    Config
	log    *slog.Logger
	store  *store
	rooms  *roomstore.Store // the rooms' settings, read for members' requests
	exprs  *tag.Cache
	leave  *leaveIndex
	stopKV func() // ends the watch that feeds leave
	subs   []*nats.Subscription
	slots  chan struct{}  // one per request being served
	wg     sync.WaitGroup // the requests being served
	once   sync.Once

	mu     sync.Mutex // guards closed, and wg.Add against Close's wg.Wait
	closed bool

	m *metrics
	// broadcastFailures counts changes made whose event did not reach the room service.
	broadcastFailures atomic.Int64
	// dropped counts entries taken out because their owner's session ended.
	dropped atomic.Int64
}

// New returns a room queue service; Start subscribes it.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg: cfg, log: cfg.Log.With("svc", "roomqueue"), exprs: tag.NewCache(1024),
		leave: newLeaveIndex(), slots: make(chan struct{}, cfg.Workers), m: newMetrics(cfg.Registerer),
	}, nil
}

// Start opens the bucket, follows it, and subscribes the service.
func (s *Service) Start() (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.store, err = openStore(ctx, s.cfg.Bus, s.cfg.KVReplicas, s.m.retries); err != nil {
		return err
	}
	if s.rooms, err = roomstore.OpenStore(ctx, s.cfg.Bus, s.cfg.KVReplicas); err != nil {
		return err
	}
	if s.stopKV, err = bus.FollowKV(ctx, s.store.kv, s.leave.apply); err != nil {
		return err
	}
	for subject, h := range map[string]nats.MsgHandler{
		bus.SubjectQueue:     s.onRequest,
		bus.SubjectAppEvents: s.onSessions,
	} {
		sub, err := s.cfg.Bus.QueueSubscribe(subject, s.cfg.Queue, h)
		if err != nil {
			return fmt.Errorf("roomqueue: subscribe %s: %w", subject, err)
		}
		// Logouts of a whole node come at once; none may be dropped.
		_ = sub.SetPendingLimits(-1, -1)
		s.subs = append(s.subs, sub)
	}
	return s.cfg.Bus.Flush()
}

// Close unsubscribes the service and waits for the requests it is serving. It may be called
// more than once.
func (s *Service) Close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.once.Do(func() {
		if s.stopKV != nil {
			s.stopKV()
		}
	})
}

// Stats returns the changes whose broadcast failed and the entries dropped because their
// owner's session ended, since the instance started.
func (s *Service) Stats() (broadcastFailures, dropped int64) {
	return s.broadcastFailures.Load(), s.dropped.Load()
}

// serve runs work on a goroutine of its own, waiting for a free slot first: a NATS handler
// must not wait on KV, or one slow write holds up every request behind it. Once Close has begun
// it drops work: a handler still running after the unsubscribe, whose requester times out.
func (s *Service) serve(work func()) {
	s.slots <- struct{}{}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.slots
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer func() { <-s.slots; s.wg.Done() }()
		work()
	}()
}

func (s *Service) onRequest(msg *nats.Msg) {
	var req buspb.QueueBusRequest
	if err := proto.Unmarshal(msg.Data, &req); err != nil {
		bus.Respond(s.log, msg, &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request does not parse"})
		return
	}
	s.serve(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		defer cancel()
		rep := s.handle(ctx, &req)
		s.m.requests.WithLabelValues(opName(req.Op), strconv.Itoa(int(rep.Code))).Inc()
		bus.Respond(s.log, msg, rep)
	})
}

// handle serves one request and returns its reply.
func (s *Service) handle(ctx context.Context, req *buspb.QueueBusRequest) *buspb.Reply {
	q := req.GetRequest()
	if err := s.check(req); err != nil {
		return s.refused(err)
	}
	who, err := s.caller(ctx, req)
	if err != nil {
		return s.refused(err)
	}
	switch req.Op {
	case clientpb.QueueOp_QUEUE_OP_LIST, clientpb.QueueOp_QUEUE_OP_PEEK:
		st, _, err := s.store.read(ctx, req.App, q.Room)
		if err != nil {
			return s.refused(err)
		}
		resp := &roompb.QueueResponse{Version: st.Version, Entries: st.Entries}
		if req.Op == clientpb.QueueOp_QUEUE_OP_PEEK {
			i := find(st, q.Key)
			if i < 0 {
				return s.refused(notFound(q.Key))
			}
			resp.Entries = st.Entries[i : i+1]
		}
		return &buspb.Reply{Queue: resp}
	}
	maxEntries, err := s.maxEntries(ctx, req.App, q.Room)
	if err != nil {
		return s.refused(err)
	}
	var answer []*clientpb.QueueEntry
	var ev *clientpb.QueueEvent
	st, err := s.store.update(ctx, req.App, q.Room, func(st *clientpb.QueueState) (err error) {
		answer, ev, err = change(st, req.Op, q, who, maxEntries, s.cfg.Now())
		return err
	})
	if err != nil {
		return s.refused(err)
	}
	ev.Version = st.Version
	s.broadcast(ctx, req.App, q.Room, ev)
	return &buspb.Reply{Queue: &roompb.QueueResponse{Entries: answer, Version: st.Version}}
}

// check refuses a malformed request.
func (s *Service) check(req *buspb.QueueBusRequest) error {
	q := req.GetRequest()
	bad := func(format string, args ...any) error {
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, format, args...)
	}
	switch {
	case q == nil || req.App == "":
		return bad("request needs an app and a room")
	case !auth.ValidName(q.Room):
		return bad("room %q is not a valid name", q.Room)
	case req.Op < clientpb.QueueOp_QUEUE_OP_OFFER || req.Op > clientpb.QueueOp_QUEUE_OP_CLEAR:
		return bad("unknown queue op %d", req.Op)
	case q.Key != "" && !validKey(q.Key):
		return bad("key must be 1 to %d bytes of A-Z a-z 0-9 _ - . :", MaxKeyBytes)
	case q.Key == "" && (req.Op == clientpb.QueueOp_QUEUE_OP_OFFER || req.Op == clientpb.QueueOp_QUEUE_OP_REMOVE):
		return bad("%s needs a key", opName(req.Op))
	case len(q.Value) > s.cfg.MaxValueBytes:
		return refuse(clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, "value is %d bytes, the limit is %d", len(q.Value), s.cfg.MaxValueBytes)
	case q.Uid != "" && !auth.ValidName(q.Uid):
		return bad("uid %q is not a valid name", q.Uid)
	case q.DropOnLeave && q.SessionId == "":
		return bad("drop_on_leave needs the session that owns the entry")
	}
	return nil
}

// caller describes who asks; for a member, what the room's settings allow it.
func (s *Service) caller(ctx context.Context, req *buspb.QueueBusRequest) (caller, error) {
	if req.MemberSession == "" {
		return caller{}, nil
	}
	q := req.Request
	who := caller{member: true, uid: q.Uid, session: req.MemberSession}
	if q.SessionId != req.MemberSession {
		return who, refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a member's request names its own session")
	}
	meta, _, err := s.rooms.Room(ctx, req.App, q.Room)
	if err != nil {
		return who, err
	}
	st := meta.GetSettings()
	allowed := func(src string) bool {
		e, err := s.exprs.Get(src)
		return err == nil && e.EvalTags(req.MemberTags, q.Uid)
	}
	who.mayChange = st.GetQueueExpr() == "" || allowed(st.GetQueueExpr())
	who.admin = who.mayChange && st.GetQueueAdminExpr() != "" && allowed(st.GetQueueAdminExpr())
	return who, nil
}

// maxEntries is the room's limit on its queue.
func (s *Service) maxEntries(ctx context.Context, app, roomName string) (int, error) {
	meta, _, err := s.rooms.Room(ctx, app, roomName)
	if err != nil {
		return 0, err
	}
	if n := int(meta.GetSettings().GetQueueMaxEntries()); n > 0 && n < s.cfg.MaxEntries {
		return n, nil
	}
	return s.cfg.MaxEntries, nil
}

// broadcast sends a change to the room through the room service, as a critical message from
// the app server. A failure is counted and logged: the change is made, and members see a gap
// in the versions and list the queue again.
func (s *Service) broadcast(ctx context.Context, app, roomName string, ev *clientpb.QueueEvent) {
	body, err := proto.Marshal(ev)
	if err == nil {
		var rep buspb.Reply
		err = bus.Request(ctx, s.cfg.Bus, bus.SubjectRoomSend, &buspb.SendRequest{
			App: app, Room: roomName, Type: EventType, Lane: clientpb.Lane_LANE_CRITICAL, Body: body,
		}, &rep)
		if err == nil && rep.Code != 0 {
			err = fmt.Errorf("room service refused it: %d %s", rep.Code, rep.Message)
		}
	}
	if err != nil {
		s.broadcastFailures.Add(1)
		s.m.broadcasts.Inc()
		s.log.Warn("queue change not broadcast", "app", app, "room", roomName, "version", ev.Version, "err", err)
	}
}

// refused turns an error into the reply a requester gets; one that is not a refusal is logged.
func (s *Service) refused(err error) *buspb.Reply {
	var r *refusal
	if errors.As(err, &r) {
		return &buspb.Reply{Code: uint32(r.code), Message: r.msg}
	}
	s.log.Warn("queue request failed", "err", err)
	if errors.Is(err, errContended) {
		return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "the queue is busy; try again"}
	}
	return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "the queue could not be read or written"}
}

// opName names an op the way docs/protocol.md does ("offer").
func opName(op clientpb.QueueOp) string {
	return strings.ToLower(strings.TrimPrefix(op.String(), "QUEUE_OP_"))
}
