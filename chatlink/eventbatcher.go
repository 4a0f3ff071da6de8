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

	mu      sync.Mutex // guards the fields below
	pending []*buspb.SessionEvent
	traced  []trace.SpanContext // the sampled spans that made pending's events, at most maxEventLinks
}

const presenceFlushEvery = 100 * time.Millisecond

// maxEventLinks bounds the spans a batch's publish links to (OpenTelemetry's default limit of
// links per span): a burst of logins with tracing on keeps a bounded list.
const maxEventLinks = 128

// add queues ev for the next batch; from is the span of the login that made it (a zero
// SpanContext when there is none, or tracing is off).
func (b *eventBatcher) add(ev *buspb.SessionEvent, from trace.SpanContext) {
	b.mu.Lock()
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
	evs, traced := b.pending, b.traced
	b.pending, b.traced = nil, nil
	b.mu.Unlock()
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
