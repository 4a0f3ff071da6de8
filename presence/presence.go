// Package presence is the presence service: who is online, in which room, on which node.
// ChatLinks publish login and logout events in batches; the service answers queries.
//
// What exists now is the walking skeleton: sessions are kept in this instance's memory and the
// only query is the online count of an app. Sessions per user, node leases, multi-device policy
// and events for app backends come with the presence work; the service must not grow state that
// only one instance holds.
package presence

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// Config configures a presence service instance.
type Config struct {
	// Bus is the NATS connection. Required.
	Bus *nats.Conn
	// Log receives the service's logs. Zero value means none.
	Log *slog.Logger
	// Queue is the NATS queue group instances share. Zero value means "presence".
	Queue string
}

// Service is one instance of the presence service.
type Service struct {
	cfg  Config
	log  *slog.Logger
	subs []*nats.Subscription

	mu       sync.Mutex                  // guards sessions
	sessions map[string]*pb.SessionEvent // by session id: the login event
}

// New returns a presence service; Start subscribes it.
func New(cfg Config) (*Service, error) {
	if cfg.Bus == nil {
		return nil, errors.New("presence: Config.Bus is required")
	}
	if cfg.Queue == "" {
		cfg.Queue = "presence"
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: log.With("svc", "presence"), sessions: make(map[string]*pb.SessionEvent)}, nil
}

// Start subscribes the service to its subjects.
func (s *Service) Start() error {
	for subject, h := range map[string]nats.MsgHandler{
		bus.SubjectPresenceEvents: s.onEvents,
		bus.SubjectPresenceCount:  s.onCount,
	} {
		sub, err := s.cfg.Bus.QueueSubscribe(subject, s.cfg.Queue, h)
		if err != nil {
			s.Close()
			return fmt.Errorf("presence: subscribe %s: %w", subject, err)
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
}

func (s *Service) onEvents(msg *nats.Msg) {
	var evs pb.SessionEvents
	if err := proto.Unmarshal(msg.Data, &evs); err != nil {
		s.log.Warn("dropping session events that do not parse", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs.Events {
		switch ev.Kind {
		case pb.SessionEvent_KIND_LOGIN:
			s.sessions[ev.SessionId] = ev
		case pb.SessionEvent_KIND_LOGOUT:
			delete(s.sessions, ev.SessionId)
		}
	}
}

// onCount answers the online count of the app named in the request's app field.
func (s *Service) onCount(msg *nats.Msg) {
	var req pb.JoinRequest // only app is read
	if err := proto.Unmarshal(msg.Data, &req); err != nil {
		bus.Respond(s.log, msg, &pb.Reply{Code: uint32(pb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request does not parse"})
		return
	}
	s.mu.Lock()
	var n int64
	for _, ev := range s.sessions {
		if ev.App == req.App {
			n++
		}
	}
	s.mu.Unlock()
	bus.Respond(s.log, msg, &pb.Reply{Room: &pb.RoomInfo{App: req.App, Online: n}})
}
