// Package room is the room service: it accepts members into rooms, gives every message its id
// and server time, and broadcasts it on the room's subject to the ChatLinks that hold members.
// It also serves the HTTP server API for app backends (api.go).
//
// What exists now is the walking skeleton: membership counts are kept in this instance's
// memory from the ChatLinks' join and leave requests, and any member may send. Room metadata
// in JetStream KV, mute and ban, history and resync come with the room management work; the
// service must not grow state that only one instance holds.
package room

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/ids"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// Limits on what a room accepts from a sender.
const (
	MaxBodyBytes = 16 << 10
	MaxTypeBytes = 32
)

// Config configures a room service instance.
type Config struct {
	// Bus is the NATS connection. Required.
	Bus *nats.Conn
	// Log receives the service's logs. Zero value means none.
	Log *slog.Logger
	// Queue is the NATS queue group instances share. Zero value means "room".
	Queue string
	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
}

// Service is one instance of the room service.
type Service struct {
	cfg      Config
	log      *slog.Logger
	ids      ids.Generator
	subs     []*nats.Subscription
	settings *settingsStore

	mu    sync.Mutex // guards rooms
	rooms map[roomKey]map[string]int64
}

type roomKey struct{ app, room string }

// New returns a room service; Start subscribes it.
func New(cfg Config) (*Service, error) {
	if cfg.Bus == nil {
		return nil, errors.New("room: Config.Bus is required")
	}
	if cfg.Queue == "" {
		cfg.Queue = "room"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: log.With("svc", "room"), rooms: make(map[roomKey]map[string]int64)}, nil
}

// Start loads the rooms' settings and subscribes the service to its subjects.
func (s *Service) Start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := openSettings(ctx, s.cfg.Bus, s.log)
	if err != nil {
		return err
	}
	s.settings = st
	handlers := map[string]nats.MsgHandler{
		bus.SubjectRoomJoin:     s.onJoin,
		bus.SubjectRoomLeave:    s.onLeave,
		bus.SubjectRoomSend:     s.onSend,
		bus.SubjectRoomInfo:     s.onInfo,
		bus.SubjectRoomSettings: s.onSettings,
	}
	for subject, h := range handlers {
		sub, err := s.cfg.Bus.QueueSubscribe(subject, s.cfg.Queue, h)
		if err != nil {
			s.Close()
			return fmt.Errorf("room: subscribe %s: %w", subject, err)
		}
		s.subs = append(s.subs, sub)
	}
	return s.cfg.Bus.Flush()
}

// Close unsubscribes the service. It may be called more than once.
func (s *Service) Close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
	if s.settings != nil {
		s.settings.close()
		s.settings = nil
	}
}

func (s *Service) onJoin(msg *nats.Msg) {
	var req pb.JoinRequest
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	k := roomKey{req.App, req.Room}
	s.mu.Lock()
	nodes := s.rooms[k]
	if nodes == nil {
		nodes = make(map[string]int64)
		s.rooms[k] = nodes
	}
	nodes[req.Node]++
	info := s.infoLocked(k)
	s.mu.Unlock()
	bus.Respond(s.log, msg, &pb.Reply{Room: info, Settings: s.settings.get(req.App, req.Room)})
}

func (s *Service) onLeave(msg *nats.Msg) {
	var req pb.LeaveRequest
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	k := roomKey{req.App, req.Room}
	s.mu.Lock()
	if nodes := s.rooms[k]; nodes != nil {
		if nodes[req.Node]--; nodes[req.Node] <= 0 {
			delete(nodes, req.Node)
		}
		if len(nodes) == 0 {
			delete(s.rooms, k)
		}
	}
	s.mu.Unlock()
	bus.Respond(s.log, msg, &pb.Reply{})
}

func (s *Service) onInfo(msg *nats.Msg) {
	var req pb.JoinRequest // only app and room are read
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	s.mu.Lock()
	info := s.infoLocked(roomKey{req.App, req.Room})
	s.mu.Unlock()
	bus.Respond(s.log, msg, &pb.Reply{Room: info})
}

// infoLocked reports a room's members. Caller holds s.mu.
func (s *Service) infoLocked(k roomKey) *pb.RoomInfo {
	info := &pb.RoomInfo{App: k.app, Room: k.room, Nodes: make(map[string]int64)}
	for node, n := range s.rooms[k] {
		info.Nodes[node] = n
		info.Online += n
	}
	return info
}

func (s *Service) onSettings(msg *nats.Msg) {
	var req pb.SettingsRequest
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	if !req.Update {
		bus.Respond(s.log, msg, &pb.Reply{Settings: s.settings.get(req.App, req.Room)})
		return
	}
	st := req.Settings
	if st == nil {
		st = &pb.RoomSettings{}
	}
	if err := ValidateSettings(st); err != nil {
		bus.Respond(s.log, msg, &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.settings.put(ctx, req.App, req.Room, st); err != nil {
		s.log.Warn("settings not stored", "app", req.App, "room", req.Room, "err", err)
		bus.Respond(s.log, msg, &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "settings not stored"})
		return
	}
	// ChatLinks holding the room learn the change on its broadcast subject, in order with its
	// messages.
	if err := bus.Publish(s.cfg.Bus, bus.RoomSubject(req.App, req.Room), &pb.RoomBatch{Settings: st}); err != nil {
		s.log.Warn("settings change not broadcast", "app", req.App, "room", req.Room, "err", err)
	}
	bus.Respond(s.log, msg, &pb.Reply{Settings: st})
}

func (s *Service) onSend(msg *nats.Msg) {
	var req pb.SendRequest
	if rep := decode(msg, &req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	if rep := ValidateSend(&req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	if rep := s.authorizeSend(&req); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	now := s.cfg.Now()
	m := &pb.Message{
		Id:           s.ids.New(now),
		Room:         req.Room,
		Sender:       req.Uid,
		Type:         req.Type,
		Lane:         req.Lane,
		TagExpr:      req.TagExpr,
		Body:         req.Body,
		ServerTimeMs: now.UnixMilli(),
	}
	if m.Lane == pb.Lane_LANE_UNSPECIFIED {
		m.Lane = pb.Lane_LANE_NORMAL
	}
	batch := &pb.RoomBatch{Messages: []*pb.Message{m}, SenderSessions: []string{req.SessionId}}
	if err := bus.Publish(s.cfg.Bus, bus.RoomSubject(req.App, req.Room), batch); err != nil {
		s.log.Warn("broadcast failed", "app", req.App, "room", req.Room, "err", err)
		bus.Respond(s.log, msg, &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "broadcast failed"})
		return
	}
	bus.Respond(s.log, msg, &pb.Reply{MessageId: m.Id, ServerTimeMs: m.ServerTimeMs})
}

// ValidateSend checks a send request against the room's limits. It returns nil when the
// request is acceptable, otherwise the reply to give.
func ValidateSend(req *pb.SendRequest) *pb.Reply {
	bad := func(code pb.ErrorCode, format string, args ...any) *pb.Reply {
		return &pb.Reply{Code: uint32(code), Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case req.App == "" || req.Room == "":
		return bad(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "app and room are required")
	case len(req.Body) == 0:
		return bad(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "body is empty")
	case len(req.Body) > MaxBodyBytes:
		return bad(pb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, "body is %d bytes, the limit is %d", len(req.Body), MaxBodyBytes)
	case len(req.Type) > MaxTypeBytes || !utf8.ValidString(req.Type):
		return bad(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "type must be valid UTF-8 of at most %d bytes", MaxTypeBytes)
	case req.Lane < pb.Lane_LANE_UNSPECIFIED || req.Lane > pb.Lane_LANE_BULK:
		return bad(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown lane %d", req.Lane)
	}
	if req.TagExpr != "" {
		if _, err := exprs.Get(req.TagExpr); err != nil {
			return bad(pb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR, "%v", err)
		}
	}
	return nil
}

// exprs caches the tag expressions the room service and the API have checked.
var exprs = tag.NewCache(4096)

// authorizeSend applies the room's send permissions to a member's message. It may narrow the
// message's audience (scope_prefix); it returns the refusal, or nil.
func (s *Service) authorizeSend(req *pb.SendRequest) *pb.Reply {
	if req.FromApp {
		return nil
	}
	st := s.settings.get(req.App, req.Room)
	if st == nil {
		return nil
	}
	allowed := func(src string) bool {
		e, err := exprs.Get(src)
		return err == nil && e.EvalTags(req.SenderTags, req.Uid)
	}
	forbid := func(msg string) *pb.Reply {
		return &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_FORBIDDEN), Message: msg}
	}
	switch {
	case st.SendExpr != "" && !allowed(st.SendExpr):
		return forbid("you may not send in this room")
	case st.BroadcastExpr == "" || allowed(st.BroadcastExpr):
		return nil
	case req.TagExpr != "":
		return forbid("you may not choose who receives your messages in this room")
	case st.ScopePrefix == "":
		return forbid("only some members may send in this room")
	}
	var scope []string
	for _, t := range req.SenderTags {
		if strings.HasPrefix(t, st.ScopePrefix) {
			scope = append(scope, strconv.Quote(t)+" in tags")
		}
	}
	if len(scope) == 0 {
		return forbid("you have no " + st.ScopePrefix + " tag to send to")
	}
	req.TagExpr = strings.Join(scope, " || ")
	return nil
}

// decode unmarshals a request, or returns the reply that refuses it.
func decode(msg *nats.Msg, into proto.Message) *pb.Reply {
	if err := proto.Unmarshal(msg.Data, into); err != nil {
		return &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request does not parse"}
	}
	return nil
}
