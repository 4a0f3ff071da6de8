package room

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/tracing"
	"roomcast/proto/clientpb"
)

// DefaultBatchWindow is how long an instance gathers a room's messages before it sends them to
// the room's nodes as one RoomBatch (Config.BatchWindow).
const DefaultBatchWindow = 20 * time.Millisecond

// batcher gathers the messages an instance accepts for each room during a window and then
// numbers, broadcasts and records them together: one room_seq increment, one RoomBatch on the
// room's subject and one run of history writes per room and window, however many senders. The
// bus then carries a room at most 1/window batches a second from each instance, whatever the
// upstream rate, and no send waits for JetStream.
//
// A room's windows leave in order: a window's batch is published before the next window's is
// numbered (pending.flushing). Each instance batches what it receives, so with several
// instances a room gets one batch per instance and window, numbered in the order their counter
// increments land and delivered in the order they reach a node: between instances the order is
// by window, not by the exact arrival of each message.
type batcher struct {
	s      *Service
	window time.Duration

	mu     sync.Mutex // guards rooms and closed
	rooms  map[roomKey]*pending
	closed bool // after close, adds are sent at once
	wg     sync.WaitGroup
}

// pending is one room's messages waiting for the end of their window.
type pending struct {
	flushing sync.Mutex // held while a window is numbered and published: keeps the room's windows in order
	msgs     []*clientpb.Message
	senders  []string     // the sessions that sent msgs, "" for the app server
	links    []trace.Link // the traced sends of msgs (tracing on), for the publish's span
	timer    *time.Timer  // when not nil, it will flush this room; caller holds batcher.mu
	sent     *windowDone  // the outcome of the window msgs belong to
}

// windowDone is the outcome of one window: done is closed once its batch was published (err
// nil) or given up (err set). A critical send waits for it before it is answered, so that a
// 200 means the message is numbered, kept and published.
type windowDone struct {
	done chan struct{}
	err  error // set before done is closed
}

func newWindowDone() *windowDone { return &windowDone{done: make(chan struct{})} }

// reply waits for the window and returns rep if it was published, otherwise the refusal.
func (w *windowDone) reply(rep *buspb.Reply) *buspb.Reply {
	<-w.done
	if w.err != nil {
		return notSent()
	}
	return rep
}

func (w *windowDone) finish(err error) {
	w.err = err
	close(w.done)
}

func newBatcher(s *Service, window time.Duration) *batcher {
	return &batcher{s: s, window: window, rooms: make(map[roomKey]*pending)}
}

// add queues a room's accepted messages for the current window and returns the window's
// outcome.
func (b *batcher) add(app, room string, batch *buspb.RoomBatch, sender trace.SpanContext) *windowDone {
	k := roomKey{app, room}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		w := newWindowDone()
		w.finish(b.s.broadcast(app, room, batch, linkTo(nil, sender)))
		return w
	}
	p := b.rooms[k]
	if p == nil {
		p = &pending{}
		b.rooms[k] = p
	}
	p.msgs = append(p.msgs, batch.Messages...)
	p.senders = append(p.senders, batch.SenderSessions...)
	p.links = linkTo(p.links, sender)
	if p.sent == nil {
		p.sent = newWindowDone()
	}
	w := p.sent
	if p.timer == nil {
		b.wg.Add(1)
		p.timer = time.AfterFunc(b.window, func() {
			defer b.wg.Done()
			b.flush(k, p)
		})
	}
	b.mu.Unlock()
	return w
}

// flush sends what room k gathered. A room has one timer at a time, so at most one flush waits
// for another.
func (b *batcher) flush(k roomKey, p *pending) {
	p.flushing.Lock()
	defer p.flushing.Unlock()
	b.mu.Lock()
	batch, sent, links := &buspb.RoomBatch{Messages: p.msgs, SenderSessions: p.senders}, p.sent, p.links
	p.msgs, p.senders, p.links, p.timer, p.sent = nil, nil, nil, nil, nil
	b.mu.Unlock()

	sent.finish(b.s.broadcast(k.app, k.room, batch, links))

	b.mu.Lock()
	if p.timer == nil && len(p.msgs) == 0 && b.rooms[k] == p {
		delete(b.rooms, k)
	}
	b.mu.Unlock()
}

// close sends what is pending at once and makes later adds send at once. It may be called more
// than once.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	var early []func()
	for k, p := range b.rooms {
		if p.timer != nil && p.timer.Stop() {
			early = append(early, func() {
				defer b.wg.Done()
				b.flush(k, p)
			})
		}
	}
	b.mu.Unlock()
	for _, f := range early {
		f()
	}
	b.wg.Wait()
}

// broadcast numbers a room's accepted messages, stamps them with the time they leave, appends
// them to the history and then publishes them to the room's nodes (and, in CDN mode, its CDN
// lanes to their pusher). It returns an error when the batch was not published; its messages
// are then counted as unsent and logged.
//
// A batch holding critical messages is published only once it is numbered and kept, and flushed
// to the NATS server after: its numbering and recording are tried again until criticalTimeout
// (NATS reconnecting), and if that passes the batch is given up whole, so that a critical send
// answered 200 (send waits for this) is numbered, recoverable and on its way to every node. A
// batch without critical messages goes out unnumbered or unkept rather than late, as before.
//
// The server time is the time of the publish, not of the acceptance: a CDN pusher files a
// message under the window of its server time, and one that came a batch window (or a slow
// numbering) after its time would miss the pusher's grace and land in the next segment.
//
// With tracing on, the publish is a span ("room batch publish") linked to the sends it carries;
// the batches to CDN pushers carry its trace context.
func (s *Service) broadcast(app, room string, batch *buspb.RoomBatch, links []trace.Link) error {
	ctx := context.Background()
	if tracing.Enabled() {
		var span trace.Span
		ctx, span = tracing.Start(ctx, "room batch publish", trace.SpanKindProducer, trace.WithLinks(links...),
			trace.WithAttributes(attribute.String("messaging.destination.name", bus.RoomSubject(app, room)), attribute.Int("messaging.batch.message_count", len(batch.Messages))))
		defer span.End()
	}
	critical := slices.ContainsFunc(batch.Messages, func(m *clientpb.Message) bool { return m.Lane == clientpb.Lane_LANE_CRITICAL })
	deadline := time.Now().Add(criticalTimeout)
	err := s.untilCritical(critical, deadline, func(ctx context.Context) error { return s.hist.number(ctx, app, room, batch.Messages) })
	if err != nil && critical {
		return s.unsent(app, room, batch, err)
	}
	if err != nil {
		s.log.Warn("messages not numbered", "app", app, "room", room, "err", err)
	}
	sent := s.cfg.Now().UnixMilli()
	for _, m := range batch.Messages {
		m.ServerTimeMs = sent
	}
	err = s.untilCritical(critical, deadline, func(ctx context.Context) error { return s.hist.record(ctx, app, batch.Messages, batch.SenderSessions) })
	if err != nil && critical {
		return s.unsent(app, room, batch, err)
	}
	if err != nil {
		s.log.Warn("messages not kept in history", "app", app, "room", room, "err", err)
	}
	// In CDN mode the room's CDN lanes go to its pusher instead of the long connections.
	long, toPushers := s.cdn.split(app, room, batch)
	// The window's numbers go to the nodes even when its numbered messages all went to the
	// pusher: a node waits for a missing number (chatlink/order.go).
	long.FirstRoomSeq, long.LastRoomSeq = numbered(batch.Messages)
	if len(long.Messages) > 0 || long.LastRoomSeq > 0 {
		err = bus.Publish(s.cfg.Bus, bus.RoomSubject(app, room), long)
	}
	for pusher, b := range toPushers {
		err = errors.Join(err, bus.PublishTraced(ctx, s.cfg.Bus, bus.CdnPushSubject(pusher), b))
	}
	if err == nil && critical {
		err = s.cfg.Bus.FlushTimeout(max(time.Until(deadline), numberTimeout/10))
	}
	if err != nil {
		return s.unsent(app, room, batch, err)
	}
	s.metrics.batches.Inc()
	s.metrics.batchMessages.Observe(float64(len(batch.Messages)))
	return nil
}

// numbered returns the first and last room_seq of msgs (0, 0: none numbered). number gives a
// window's numbered messages consecutive numbers in their order.
func numbered(msgs []*clientpb.Message) (first, last uint64) {
	for _, m := range msgs {
		if m.RoomSeq > 0 {
			if first == 0 {
				first = m.RoomSeq
			}
			last = m.RoomSeq
		}
	}
	return first, last
}

// untilCritical runs step with numberTimeout; for a batch holding critical messages it tries
// again until deadline has passed or the service closes its bus.
func (s *Service) untilCritical(critical bool, deadline time.Time, step func(context.Context) error) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), numberTimeout)
		err := step(ctx)
		cancel()
		if err == nil || !critical || time.Now().After(deadline) || s.cfg.Bus.IsClosed() {
			return err
		}
		s.log.Warn("critical messages not yet numbered and kept; trying again", "err", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// unsent counts and logs a batch that was not published, and returns err.
func (s *Service) unsent(app, room string, batch *buspb.RoomBatch, err error) error {
	s.metrics.unsent.Add(float64(len(batch.Messages)))
	s.log.Warn("broadcast failed", "app", app, "room", room, "messages", len(batch.Messages), "err", err)
	return err
}

// linkTo returns links with a link to the span sc appended when sc is a span's (tracing on).
func linkTo(links []trace.Link, sc trace.SpanContext) []trace.Link {
	if !sc.IsValid() {
		return links
	}
	return append(links, trace.Link{SpanContext: sc})
}
