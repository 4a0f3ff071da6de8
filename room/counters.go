package room

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/counterstore"
)

// A room's counters (likes, gifts; docs/protocol.md, "Counters") are summed in three steps: a
// ChatLink sums its members' adds per room over a window and sends the sums here as one
// CounterWindow; this service gathers a room's windows, from every ChatLink, for a tick
// (Config.CounterTick, 250 ms) and applies them to the room's record in the store
// (store/counterstore) in one compare-and-set write; then it publishes the new totals on the
// room's subject, where the ChatLinks pass them to their members. So a room costs one read and
// one write of the store per tick and instance, however many members tap.
//
// Exactly once: the record keeps, per ChatLink boot, the seq of the last window applied, and a
// node sends a room's windows one at a time and again until answered, so a window whose answer
// was lost, or that reaches two instances, is applied once. The write is a compare-and-set, so
// instances sharing a room never lose each other's windows; a window is answered only after its
// write, so a window an instance took and died with is sent again by its node to another.

// DefaultCounterTick is how long an instance gathers a room's counter windows before it writes
// them and broadcasts the totals.
const DefaultCounterTick = 250 * time.Millisecond

// counterSourceTTL is how long a record remembers a ChatLink boot that sent it nothing more: a
// window sent again after that long (its node was cut off from every instance for an hour)
// would be counted twice.
const counterSourceTTL = time.Hour

// counterWrites bounds the compare-and-set attempts of one room's tick.
const counterWrites = 8

// counterWriters bounds the rooms whose windows an instance writes at once: each is a read and
// a write of the store, a round trip to the NATS server each.
const counterWriters = 16

type counterWindow struct {
	w   *buspb.CounterWindow
	msg *nats.Msg
}

// counters gathers the rooms' windows between ticks.
type counters struct {
	s     *Service
	store *counterstore.Store

	mu      sync.Mutex // guards pending
	pending map[roomKey][]counterWindow
}

func (s *Service) openCounters(ctx context.Context) (*counters, error) {
	st, err := counterstore.Open(ctx, s.cfg.Bus, s.cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	return &counters{s: s, store: st, pending: make(map[roomKey][]counterWindow)}, nil
}

// onCounters takes a ChatLink's window (or the server API's reset) for the room's next tick.
func (s *Service) onCounters(msg *nats.Msg) {
	var w buspb.CounterWindow
	if rep := decode(msg, &w); rep != nil {
		bus.Respond(s.log, msg, rep)
		return
	}
	if rep := checkCounterWindow(&w); rep != nil {
		s.metrics.counterWindows.WithLabelValues("refused").Inc()
		bus.Respond(s.log, msg, rep)
		return
	}
	c := s.counters
	c.mu.Lock()
	k := roomKey{w.App, w.Room}
	c.pending[k] = append(c.pending[k], counterWindow{w: &w, msg: msg})
	c.mu.Unlock()
}

func checkCounterWindow(w *buspb.CounterWindow) *buspb.Reply {
	bad := func(msg string) *buspb.Reply {
		return &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: msg}
	}
	if !auth.ValidName(w.App) || !auth.ValidName(w.Room) {
		return bad("app and room must be valid names")
	}
	if w.Node != "" && w.Seq == 0 {
		return bad("a node's window needs a seq")
	}
	for _, a := range w.Adds {
		if !counterstore.ValidName(a.Name) || a.Total <= 0 {
			return bad("counter names must be 1 to 32 characters of A-Z a-z 0-9 _ - : . and sums positive")
		}
	}
	for _, name := range w.Resets {
		if !counterstore.ValidName(name) {
			return bad("counter names must be 1 to 32 characters of A-Z a-z 0-9 _ - : .")
		}
	}
	return nil
}

// countersLoop applies the windows every tick until the service stops, then once more.
func (s *Service) countersLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CounterTick)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			s.counters.flush()
			return
		case <-t.C:
			s.counters.flush()
		}
	}
}

// flush applies every room's windows gathered since the last tick, counterWriters rooms at a
// time, and returns when all are answered.
func (c *counters) flush() {
	c.mu.Lock()
	rooms := c.pending
	c.pending = make(map[roomKey][]counterWindow, len(rooms))
	c.mu.Unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, counterWriters)
	for k, ws := range rooms {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			c.applyRoom(k, ws)
		}()
	}
	wg.Wait()
}

// applyRoom writes a room's windows into its record and answers them; when the totals changed,
// it broadcasts them to the room.
func (c *counters) applyRoom(k roomKey, ws []counterWindow) {
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), storeReadTimeout)
	defer cancel()
	var err error
	for range counterWrites {
		var (
			rec *roompb.CounterRecord
			rev uint64
		)
		if rec, rev, err = c.store.Get(ctx, k.app, k.room); err != nil {
			break
		}
		next, changed, dropped := applyWindows(rec, ws, s.cfg.Now())
		if !changed {
			c.answer(ws, counterstore.Totals(rec, rev), "duplicate")
			return
		}
		var newRev uint64
		newRev, err = c.store.Put(ctx, k.app, k.room, next, rev)
		if errors.Is(err, counterstore.ErrConflict) {
			continue // another instance wrote the room's windows: read them and apply ours again
		}
		if err != nil {
			break
		}
		if dropped > 0 {
			s.metrics.counterDropped.Add(float64(dropped))
			s.log.Warn("counter adds dropped: the room has as many counters as it may", "app", k.app, "room", k.room, "adds", dropped)
		}
		s.metrics.counterWrites.Inc()
		totals := counterstore.Totals(next, newRev)
		c.answer(ws, totals, "applied")
		if err := bus.Publish(s.cfg.Bus, bus.RoomSubject(k.app, k.room), &buspb.RoomBatch{Counters: totals}); err != nil {
			s.log.Warn("counter totals not broadcast", "app", k.app, "room", k.room, "err", err)
		}
		return
	}
	// Unanswered windows would be sent again after the node's timeout; an answer now lets it
	// send them again at its next window.
	s.log.Warn("counter windows not written", "app", k.app, "room", k.room, "err", err)
	rep := &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "counters not written"}
	for _, w := range ws {
		bus.Respond(s.log, w.msg, rep)
	}
	s.metrics.counterWindows.WithLabelValues("unavailable").Add(float64(len(ws)))
}

func (c *counters) answer(ws []counterWindow, totals *clientpb.CounterTotals, result string) {
	rep := &buspb.Reply{Counters: totals}
	for _, w := range ws {
		bus.Respond(c.s.log, w.msg, rep)
	}
	c.s.metrics.counterWindows.WithLabelValues(result).Add(float64(len(ws)))
}

// applyWindows returns rec with ws applied in order (each node's window once), whether that
// changed anything, and how many adds to new counters were dropped because the room had
// counterstore.MaxPerRoom. rec is not changed.
func applyWindows(rec *roompb.CounterRecord, ws []counterWindow, now time.Time) (next *roompb.CounterRecord, changed bool, dropped int) {
	next = &roompb.CounterRecord{Totals: maps.Clone(rec.GetTotals()), Sources: maps.Clone(rec.GetSources())}
	if next.Totals == nil {
		next.Totals = make(map[string]int64)
	}
	if next.Sources == nil {
		next.Sources = make(map[string]*roompb.CounterSource)
	}
	nowMS := now.UnixMilli()
	for _, cw := range ws {
		w := cw.w
		if w.Node != "" {
			src := w.Node + "/" + w.Boot
			if last := next.Sources[src]; last != nil && w.Seq <= last.Seq {
				continue // applied before: its answer was lost, or another instance had it
			}
			next.Sources[src] = &roompb.CounterSource{Seq: w.Seq, UpdatedMs: nowMS}
		}
		changed = true
		for _, name := range w.Resets {
			delete(next.Totals, name)
		}
		for _, a := range w.Adds {
			if _, ok := next.Totals[a.Name]; !ok && len(next.Totals) >= counterstore.MaxPerRoom {
				dropped++
				continue
			}
			next.Totals[a.Name] += a.Total
		}
	}
	for src, last := range next.Sources {
		if nowMS-last.UpdatedMs > counterSourceTTL.Milliseconds() {
			delete(next.Sources, src)
		}
	}
	return next, changed, dropped
}

// counterTotals returns the room's counters as stored, for a node's first login of the room;
// nil when it has none or the store did not answer.
func (s *Service) counterTotals(ctx context.Context, app, room string) *clientpb.CounterTotals {
	rec, rev, err := s.counters.store.Get(ctx, app, room)
	if err != nil {
		s.log.Warn("counters not read for a join", "app", app, "room", room, "err", err)
		return nil
	}
	if rev == 0 {
		return nil
	}
	return counterstore.Totals(rec, rev)
}
