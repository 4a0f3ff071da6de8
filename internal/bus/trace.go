package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[0] != "00" || !lowerHex(parts[1], 32) || !lowerHex(parts[2], 16) || !lowerHex(parts[3], 2) ||
		strings.Trim(parts[1], "0") == "" || strings.Trim(parts[2], "0") == "" {
		return "", false
	}
	return parts[1], true
}

func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ChildTraceparent returns the traceparent of a new span under tp (the same trace, a new parent
// id, the same flags), or of a new sampled trace when tp is not well formed.
func ChildTraceparent(tp string) string {
	span := make([]byte, 8)
	_, _ = rand.Read(span)
	if trace, ok := TraceID(tp); ok {
		return "00-" + trace + "-" + hex.EncodeToString(span) + "-" + tp[len(tp)-2:]
	}
	trace := make([]byte, 16)
	_, _ = rand.Read(trace)
	return "00-" + hex.EncodeToString(trace) + "-" + hex.EncodeToString(span) + "-01"
}

// headerCarrier lets the OpenTelemetry propagator read and write a NATS message's header.
type headerCarrier nats.Header

func (h headerCarrier) Get(key string) string { return nats.Header(h).Get(key) }
func (h headerCarrier) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// StartServer begins the server span called name of a request that came over the bus, in the
// trace its traceparent header names (or a new one). The caller ends the span.
func StartServer(msg *nats.Msg, name string) (context.Context, trace.Span) {
	ctx := context.Background()
	if !tracing.Enabled() {
		return tracing.Start(ctx, name, trace.SpanKindServer)
	}
	if msg.Header != nil {
		ctx = tracing.Extract(ctx, headerCarrier(msg.Header))
	}
	return tracing.Start(ctx, name, trace.SpanKindServer,
		trace.WithAttributes(attribute.String("messaging.destination.name", msg.Subject)))
}
