// Package tracing turns on OpenTelemetry traces for a Roomcast process: spans are sampled by
// a ratio (following the caller's decision when the trace came from elsewhere) and exported in
// batches over OTLP/HTTP (protobuf) to a collector. Components record their spans with Start
// and Enabled; the trace context crosses NATS in the W3C traceparent header (internal/bus).
// Tracing is off until Setup is called with an endpoint, and then costs nothing: Start returns
// the context it was given and a span that records nothing. It does not choose what to trace
// (the components do) and keeps no spans itself.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config says where a process sends its spans.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP URL, such as http://collector:4318 (the path
	// /v1/traces is added when the URL has none). Empty means tracing stays off.
	Endpoint string
	// SampleRatio is the share of new traces recorded, 0 to 1; a trace begun by a caller
	// (a traceparent header) follows the caller's decision.
	SampleRatio float64
	// Service names the process in its spans (service.name), such as "roomcast-chatlink".
	Service string
}

// enabled is set once Setup has installed a tracer provider.
var enabled atomic.Bool

// Enabled reports whether spans are being recorded in this process.
func Enabled() bool { return enabled.Load() }

// Setup starts exporting the process's spans as cfg says and returns the function that sends
// the spans still buffered and stops. With no endpoint it does nothing (stop is a no-op).
func Setup(cfg Config) (stop func(context.Context) error, err error) {
	if cfg.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	if cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, fmt.Errorf("sample ratio %v: want 0 to 1", cfg.SampleRatio)
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("otlp endpoint %q: want an http:// or https:// URL such as http://collector:4318", cfg.Endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(cfg.Service)))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		otel.SetTracerProvider(noop.NewTracerProvider())
		return errors.Join(tp.ForceFlush(ctx), tp.Shutdown(ctx))
	}, nil
}

// noopSpan is the span Start returns while tracing is off.
var noopSpan = trace.SpanFromContext(context.Background())

// Start begins a span called name of the given kind under the span in ctx (or a new trace)
// and returns the context carrying it; the caller ends it. While tracing is off it returns
// ctx and a span that records nothing, without allocating.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !enabled.Load() {
		return ctx, noopSpan
	}
	return otel.Tracer("roomcast").Start(ctx, name, append(attrs, trace.WithSpanKind(kind))...)
}

// Inject writes the trace context of the span in ctx into carrier (a NATS or HTTP header),
// and reports whether there was one to write.
func Inject(ctx context.Context, carrier propagation.TextMapCarrier) bool {
	if !enabled.Load() || !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	return true
}

// Extract returns ctx carrying the remote span context carrier holds (a traceparent), for a
// server span to be started under it. While tracing is off it returns ctx.
func Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if !enabled.Load() {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, carrier)
}

// MapCarrier lets the propagator read and write the trace context in a header kept as a map
// from lower-case keys to values: a NATS message's (nats.Header) or a gRPC call's metadata
// (metadata.MD). An HTTP header, whose keys are canonicalised, takes propagation.HeaderCarrier.
type MapCarrier map[string][]string

var _ propagation.TextMapCarrier = MapCarrier(nil)

// Get returns the first value of key.
func (m MapCarrier) Get(key string) string {
	if v := m[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key with value.
func (m MapCarrier) Set(key, value string) { m[key] = []string{value} }

// Keys lists the keys.
func (m MapCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
