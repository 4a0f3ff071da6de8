package chatlink

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/tracing"
)

// eventBatcher collects presence events and publishes them in batches.
//
// With tracing on, a batch carries a trace context to the presence service: its publish is a
// span ("chatlink session events publish") in the trace of the first traced login among its
// events, linked to the others', so that a login's trace goes on into presence.
type eventBatcher struct {
	n *Node

	mu      sync.Mutex // guards the fields below and conn.streamed
	pending []*buspb.SessionEvent
	traced  []trace.SpanContext // the sampled spans that made pending's events, at most maxEventLinks
	// The node's sessions as the stream tells them: published is how many sessions have their
	// login published and not their logout, delta what pending changes it by. The report
	// carries published, which a reader of the stream counts alike at the report's sequence:
	// a count taken from the connections' states instead differs while logins are between
	// their state change and their event, and presence would take that for drift.
	published, delta int64
}

const presenceFlushEvery = 100 * time.Millisecond

// maxEventLinks bounds the spans a batch's publish links to (OpenTelemetry's default limit of
// links per span): a burst of logins with tracing on keeps a bounded list.
const maxEventLinks = 128

// add queues c's login or logout event ev for the next batch; from is the span of the login
// that made it (a zero SpanContext when there is none, or tracing is off). The login of a
// connection that closed meanwhile is dropped: its close already queued its logout (or will
// not, having found no login), and a login after it would leave the session in the stream.
func (b *eventBatcher) add(c *conn, ev *buspb.SessionEvent, from trace.SpanContext) {
	b.mu.Lock()
	switch {
	case ev.Kind == buspb.SessionEvent_KIND_LOGIN && c.getState() == stateClosed:
		b.mu.Unlock()
		return
	case ev.Kind == buspb.SessionEvent_KIND_LOGIN && !c.streamed:
		c.streamed = true
		b.delta++
	case ev.Kind == buspb.SessionEvent_KIND_LOGOUT && c.streamed:
		c.streamed = false
		b.delta--
	}
	b.pending = append(b.pending, ev)
	if from.IsSampled() && len(b.traced) < maxEventLinks {
		b.traced = append(b.traced, from)
	}
	b.mu.Unlock()
}

func (b *eventBatcher) loop() {
	t := time.NewTicker(presenceFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-b.n.ctx.Done():
			return
		case <-t.C:
			b.flush()
		}
	}
}

func (b *eventBatcher) flush() {
	// Session stream hook (stream.go): events, snapshots and reports share one ordered sequence.
	b.n.stream.mu.Lock()
	defer b.n.stream.mu.Unlock()
	b.flushLocked()
}

// flushLocked publishes the pending events. Caller holds b.n.stream.mu.
func (b *eventBatcher) flushLocked() {
	b.mu.Lock()
	evs, traced := b.takeLocked()
	b.mu.Unlock()
	b.publishLocked(evs, traced)
}

// takeLocked takes the pending events out, counted as published. Caller holds b.mu.
func (b *eventBatcher) takeLocked() ([]*buspb.SessionEvent, []trace.SpanContext) {
	evs, traced := b.pending, b.traced
	b.pending, b.traced = nil, nil
	b.published += b.delta
	b.delta = 0
	return evs, traced
}

// sessions returns how many sessions the stream has told so far. Caller holds b.n.stream.mu.
func (b *eventBatcher) sessions() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.published
}

// flushStreamed publishes the pending events and returns the connections whose sessions the
// stream has told with them (no event can be queued in between), for a snapshot. A connection
// that closed and whose logout is not queued yet is left out: its logout follows, and takes
// nothing from a reader that does not have it. Caller holds b.n.stream.mu.
func (b *eventBatcher) flushStreamed() []*conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.publishLocked(b.takeLocked())
	var out []*conn
	b.n.conns.each(func(c *conn) {
		if c.streamed {
			out = append(out, c)
		}
	})
	return out
}

// publishLocked publishes evs. Caller holds b.n.stream.mu.
func (b *eventBatcher) publishLocked(evs []*buspb.SessionEvent, traced []trace.SpanContext) {
	if len(evs) == 0 {
		return
	}
	ctx := context.Background()
	if len(traced) > 0 && tracing.Enabled() {
		links := make([]trace.Link, len(traced)-1)
		for i, sc := range traced[1:] {
			links[i] = trace.Link{SpanContext: sc}
		}
		var span trace.Span
		ctx, span = tracing.Start(trace.ContextWithSpanContext(ctx, traced[0]), "chatlink session events publish", trace.SpanKindProducer,
			trace.WithLinks(links...), trace.WithAttributes(attribute.String("messaging.destination.name", bus.SubjectPresenceEvents),
				attribute.Int("messaging.batch.message_count", len(evs))))
		defer span.End()
	}
	if err := b.n.publishEventsLocked(ctx, evs); err != nil {
		b.n.log.Warn("presence events not published", "events", len(evs), "err", err)
	}
}
