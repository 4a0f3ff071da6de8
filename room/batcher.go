package room

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/bus"
	"roomcast/internal/tracing"
	pb "roomcast/proto/roomcastpb"
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
	msgs     []*pb.Message
	senders  []string     // the sessions that sent msgs, "" for the app server
	links    []trace.Link // the traced sends of msgs (tracing on), for the publish's span
	timer    *time.Timer  // when not nil, it will flush this room; caller holds batcher.mu
}

func newBatcher(s *Service, window time.Duration) *batcher {
	return &batcher{s: s, window: window, rooms: make(map[roomKey]*pending)}
}

// add queues a room's accepted messages for the current window.
func (b *batcher) add(app, room string, batch *pb.RoomBatch, sender trace.SpanContext) {
	k := roomKey{app, room}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.s.broadcast(app, room, batch, linkTo(nil, sender))
		return
	}
	p := b.rooms[k]
	if p == nil {
		p = &pending{}
		b.rooms[k] = p
	}
	p.msgs = append(p.msgs, batch.Messages...)
	p.senders = append(p.senders, batch.SenderSessions...)
	p.links = linkTo(p.links, sender)
	if p.timer == nil {
		b.wg.Add(1)
		p.timer = time.AfterFunc(b.window, func() {
			defer b.wg.Done()
			b.flush(k, p)
		})
	}
	b.mu.Unlock()
}

// flush sends what room k gathered. A room has one timer at a time, so at most one flush waits
// for another.
func (b *batcher) flush(k roomKey, p *pending) {
	p.flushing.Lock()
	defer p.flushing.Unlock()
	b.mu.Lock()
	batch := &pb.RoomBatch{Messages: p.msgs, SenderSessions: p.senders}
	links := p.links
	p.msgs, p.senders, p.links, p.timer = nil, nil, nil, nil
	b.mu.Unlock()

	b.s.broadcast(k.app, k.room, batch, links)

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

// broadcast numbers a room's accepted messages, stamps them with the time they leave,
// publishes them to the room's nodes (and, in CDN mode, its CDN lanes to their pusher) and
// appends them to the history. It returns an error when the publish failed; the messages are
// then counted as unsent and logged.
//
// The server time is the time of the publish, not of the acceptance: a CDN pusher files a
// message under the window of its server time, and one that came a batch window (or a slow
// numbering) after its time would miss the pusher's grace and land in the next segment.
//
// With tracing on, the publish is a span ("room batch publish") linked to the sends it carries.
func (s *Service) broadcast(app, room string, batch *pb.RoomBatch, links []trace.Link) error {
	if tracing.Enabled() {
		_, span := tracing.Start(context.Background(), "room batch publish", trace.SpanKindProducer, trace.WithLinks(links...),
			trace.WithAttributes(attribute.String("messaging.destination.name", bus.RoomSubject(app, room)), attribute.Int("messaging.batch.message_count", len(batch.Messages))))
		defer span.End()
	}
	s.hist.number(app, room, batch.Messages)
	sent := s.cfg.Now().UnixMilli()
	for _, m := range batch.Messages {
		m.ServerTimeMs = sent
	}
	// In CDN mode the room's CDN lanes go to its pusher instead of the long connections.
	long, toPushers := s.cdn.split(app, room, batch)
	var err error
	if len(long.Messages) > 0 {
		err = bus.Publish(s.cfg.Bus, bus.RoomSubject(app, room), long)
	}
	for pusher, b := range toPushers {
		err = errors.Join(err, bus.Publish(s.cfg.Bus, bus.CdnPushSubject(pusher), b))
	}
	if err != nil {
		s.metrics.unsent.Add(float64(len(batch.Messages)))
		s.log.Warn("broadcast failed", "app", app, "room", room, "messages", len(batch.Messages), "err", err)
		return err
	}
	s.metrics.batches.Inc()
	s.metrics.batchMessages.Observe(float64(len(batch.Messages)))
	for _, m := range batch.Messages {
		s.hist.record(app, m)
	}
	return nil
}

// linkTo returns links with a link to the span sc appended when sc is a span's (tracing on).
func linkTo(links []trace.Link, sc trace.SpanContext) []trace.Link {
	if !sc.IsValid() {
		return links
	}
	return append(links, trace.Link{SpanContext: sc})
}
