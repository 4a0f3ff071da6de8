package bus

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/tracing"
)

// W3C trace context (https://www.w3.org/TR/trace-context/) over the bus: a request sends the
// trace context of its context in the NATS header traceparent, so that the service answering
// records its span in the caller's trace (internal/tracing) and logs the trace id the caller
// logged. With tracing on, Request records a client span and sends its context; with tracing
// off, it sends the traceparent WithTraceparent put in its context, if any.

// TraceparentHeader is the header, HTTP or NATS, that carries the trace context.
const TraceparentHeader = "traceparent"

type traceKey struct{}

// WithTraceparent returns ctx carrying the traceparent tp, which requests over the bus made
// with it send on.
func WithTraceparent(ctx context.Context, tp string) context.Context {
	return context.WithValue(ctx, traceKey{}, tp)
}

// TraceparentFrom returns the traceparent ctx carries, or "".
func TraceparentFrom(ctx context.Context) string {
	tp, _ := ctx.Value(traceKey{}).(string)
	return tp
}

// TraceparentOf returns the traceparent a bus message carries when it is well formed, or "".
func TraceparentOf(msg *nats.Msg) string {
	if msg.Header == nil {
		return ""
	}
	tp := msg.Header.Get(TraceparentHeader)
	if _, ok := TraceID(tp); !ok {
		return ""
	}
	return tp
}

// TraceID returns the trace id of a well-formed version-00 traceparent
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", neither id all zeros).
func TraceID(tp string) (string, bool) {
	// Every request carries one, and the server API reads it twice: read in place.
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return "", false
	}
	trace, parent := tp[3:35], tp[36:52]
	if !lowerHex(trace) || !lowerHex(parent) || !lowerHex(tp[53:]) ||
		strings.Trim(trace, "0") == "" || strings.Trim(parent, "0") == "" {
		return "", false
	}
	return trace, true
}

func lowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ChildTraceparent returns the traceparent of a new span under tp (the same trace, a new parent
// id, the same flags), or of a new sampled trace when tp is not well formed. The new ids come
// from math/rand/v2, random like OpenTelemetry's and without crypto/rand's system call per
// request.
func ChildTraceparent(tp string) string {
	b := make([]byte, 0, 55)
	if trace, ok := TraceID(tp); ok {
		b = append(append(b, "00-"...), trace...)
		b = appendRandomHex(append(b, '-'), 8)
		return string(append(append(b, '-'), tp[53:]...))
	}
	b = appendRandomHex(append(b, "00-"...), 16)
	b = appendRandomHex(append(b, '-'), 8)
	return string(append(b, "-01"...))
}

// appendRandomHex appends n random bytes, in lower-case hex, to b.
func appendRandomHex(b []byte, n int) []byte {
	var r [16]byte
	binary.LittleEndian.PutUint64(r[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(r[8:], rand.Uint64())
	return hex.AppendEncode(b, r[:n])
}

// traceHeader returns the header that carries ctx's trace context to the next hop: with
// tracing on, the context of ctx's span; with tracing off, the traceparent WithTraceparent put
// in ctx. Nil when there is none.
func traceHeader(ctx context.Context) nats.Header {
	if tracing.Enabled() {
		h := nats.Header{}
		if tracing.Inject(ctx, tracing.MapCarrier(h)) {
			return h
		}
		return nil
	}
	if tp := TraceparentFrom(ctx); tp != "" {
		return nats.Header{TraceparentHeader: []string{tp}}
	}
	return nil
}

// PublishTraced publishes m on subject as Publish does, with ctx's trace context in the
// traceparent header (traceHeader), for the consumer's span (StartConsumer).
func PublishTraced(ctx context.Context, nc *nats.Conn, subject string, m proto.Message) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("bus: encode %s: %w", subject, err)
	}
	return nc.PublishMsg(&nats.Msg{Subject: subject, Data: data, Header: traceHeader(ctx)})
}

// StartServer begins the server span called name of a request that came over the bus, in the
// trace its traceparent header names (or a new one). The caller ends the span.
func StartServer(msg *nats.Msg, name string) (context.Context, trace.Span) {
	ctx := context.Background()
	if !tracing.Enabled() {
		return tracing.Start(ctx, name, trace.SpanKindServer)
	}
	if msg.Header != nil {
		ctx = tracing.Extract(ctx, tracing.MapCarrier(msg.Header))
	}
	return tracing.Start(ctx, name, trace.SpanKindServer,
		trace.WithAttributes(attribute.String("messaging.destination.name", msg.Subject)))
}

// StartConsumer begins the consumer span called name of a message published with a trace
// context (PublishTraced), in the trace it names. A message without one gets a span that
// records nothing: a batch no traced request made starts no trace of its own. The caller ends
// the span.
func StartConsumer(msg *nats.Msg, name string) (context.Context, trace.Span) {
	ctx := context.Background()
	if !tracing.Enabled() || msg.Header.Get(TraceparentHeader) == "" {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = tracing.Extract(ctx, tracing.MapCarrier(msg.Header))
	return tracing.Start(ctx, name, trace.SpanKindConsumer,
		trace.WithAttributes(attribute.String("messaging.destination.name", msg.Subject)))
}
