package roomqueue

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// leaveIndex knows which sessions own drop_on_leave entries, and in which queues, so that a
// logout costs a map lookup and not a read of KV: most sessions that end own no entry. It
// follows the bucket (Service.Start), a few milliseconds behind the writes; a session that
// offers and ends within that moment keeps its entry (docs/protocol.md says so).
type leaveIndex struct {
	mu      sync.Mutex                 // guards the fields below
	session map[string]map[string]bool // session -> queue keys holding its drop_on_leave entries
	queue   map[string][]string        // queue key -> the sessions it lists there
}

func newLeaveIndex() *leaveIndex {
	return &leaveIndex{session: make(map[string]map[string]bool), queue: make(map[string][]string)}
}

// apply takes in a queue's new value (nil: deleted). It is bus.FollowKV's callback.
func (x *leaveIndex) apply(key string, value []byte) {
	var st clientpb.QueueState
	if value != nil && proto.Unmarshal(value, &st) != nil {
		return // not ours to judge; the writers only write what parses
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, sess := range x.queue[key] {
		if keys := x.session[sess]; keys != nil {
			delete(keys, key)
			if len(keys) == 0 {
				delete(x.session, sess)
			}
		}
	}
	delete(x.queue, key)
	for _, e := range st.Entries {
		if !e.DropOnLeave || e.SessionId == "" {
			continue
		}
		keys := x.session[e.SessionId]
		if keys == nil {
			keys = make(map[string]bool)
			x.session[e.SessionId] = keys
		}
		if !keys[key] {
			keys[key] = true
			x.queue[key] = append(x.queue[key], e.SessionId)
		}
	}
}

// queuesOf returns, per queue key, the sessions among ended that own drop_on_leave entries there.
func (x *leaveIndex) queuesOf(ended []string) map[string]map[string]bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out map[string]map[string]bool
	for _, sess := range ended {
		for key := range x.session[sess] {
			if out == nil {
				out = make(map[string]map[string]bool)
			}
			if out[key] == nil {
				out[key] = make(map[string]bool)
			}
			out[key][sess] = true
		}
	}
	return out
}

// onSessions takes the drop_on_leave entries of the sessions that ended out of their queues.
// The presence service publishes each app's events once (the ChatLinks' logouts, and those of
// nodes whose lease ended), and one instance of this service takes each batch (a queue group).
func (s *Service) onSessions(msg *nats.Msg) {
	var evs buspb.SessionEvents
	if err := proto.Unmarshal(msg.Data, &evs); err != nil {
		s.log.Warn("dropping session events that do not parse", "err", err)
		return
	}
	var ended []string
	for _, ev := range evs.Events {
		if ev.Kind == buspb.SessionEvent_KIND_LOGOUT {
			ended = append(ended, ev.SessionId)
		}
	}
	for key, sessions := range s.leave.queuesOf(ended) {
		app, room, ok := splitKey(key)
		if !ok {
			continue
		}
		s.serve(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
			defer cancel()
			s.dropEntries(ctx, app, room, sessions)
		})
	}
}

// dropEntries takes the drop_on_leave entries of sessions out of a room's queue and broadcasts
// the change.
func (s *Service) dropEntries(ctx context.Context, app, room string, sessions map[string]bool) {
	var ev *clientpb.QueueEvent
	st, err := s.store.update(ctx, app, room, func(st *clientpb.QueueState) error {
		if ev = drop(st, sessions); ev == nil {
			return errNoChange
		}
		return nil
	})
	if err != nil {
		s.log.Warn("entries of sessions that ended not dropped", "app", app, "room", room, "sessions", len(sessions), "err", err)
		return
	}
	if st == nil {
		return // gone already
	}
	ev.Version = st.Version
	s.dropped.Add(int64(len(ev.Entries)))
	s.m.dropped.Add(float64(len(ev.Entries)))
	s.broadcast(ctx, app, room, ev)
}
