package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"roomcast/internal/bus"
	"roomcast/internal/prom"
	"roomcast/internal/tracing"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// What the API tells operators about its calls: metrics of every call (count by transport,
// method and answer code; latency by transport and method), and an audit record of every call
// that changes something (who: the app and the API key's fingerprint; what: the method; the
// target room and user; the answer; the trace id). Each call is a span of the W3C trace its
// traceparent header (HTTP) or metadata (gRPC) names, or of a new trace: its requests over
// NATS carry the span's traceparent to the services. With tracing on (internal/tracing) the
// span is recorded and exported, named by the route's pattern or the gRPC method. HTTP and gRPC
// calls are observed alike: an HTTP route by its pattern ("POST /v1/rooms/{room}/close"), a
// gRPC call by its method ("CloseRoom").

// metrics are the API's Prometheus instruments. Instances in one process share one set.
type metrics struct {
	requests *prometheus.CounterVec   // by transport, method and code
	latency  *prometheus.HistogramVec // by transport and method
	bus      *prometheus.HistogramVec // by subject
	retries  *prometheus.CounterVec   // reads asked again, by subject (requests.go)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	return &metrics{
		requests: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_api_requests_total",
			Help: "Server API calls answered, by transport (http, grpc), method (an HTTP route's pattern, a gRPC method's name) and answer code (OK or the error's name, as in docs/api.md).",
		}, []string{"transport", "method", "code"})),
		latency: prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roomcast_api_request_seconds",
			Help:    "Time to answer a server API call, by transport and method.",
			Buckets: prom.LatencyBuckets,
		}, []string{"transport", "method"})),
		bus: prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roomcast_api_bus_request_seconds",
			Help:    "Round trips of the API's requests over NATS to the services and the ChatLinks, by subject (rc.node.* as node).",
			Buckets: prom.LatencyBuckets,
		}, []string{"subject"})),
		retries: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_api_bus_read_retries_total",
			Help: "Reads the API asked a service once more over NATS because the first ask went unanswered (timed out or found no responder), by subject.",
		}, []string{"subject"})),
	}
}

// observeBus times a request over NATS to subject that started at start.
func (m *metrics) observeBus(subject string, start time.Time) {
	m.bus.WithLabelValues(busLabel(subject)).Observe(time.Since(start).Seconds())
}

// busLabel is a bus subject as the metrics name it: rc.node.* as node.
func busLabel(subject string) string {
	if strings.HasPrefix(subject, bus.NodeSubject("")) {
		return "node"
	}
	return subject
}

// observedWriter is the response writer of an HTTP call being observed: writeError and
// serveRoute tell it the answer's code and the decoded request.
type observedWriter struct {
	http.ResponseWriter
	code clientpb.ErrorCode
	msg  string
	req  proto.Message
}

// Unwrap lets http.ResponseController reach the connection (serveRoute's read deadline).
func (o *observedWriter) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// observe notes the request an HTTP route decoded, for its audit record.
func observe(w http.ResponseWriter, req proto.Message) {
	if o, ok := w.(*observedWriter); ok {
		o.req = req
	}
}

// observeHTTP wraps an HTTP route's handler with the metrics and the audit record of its calls.
func (a *API) observeHTTP(pattern string, h http.HandlerFunc) http.HandlerFunc {
	// The route's series are looked up at its first call, not at each (nor before any call:
	// a route never called has no series).
	var once sync.Once
	var calls *callMetrics
	return func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { calls = a.m.callMetrics("http", pattern) })
		start := time.Now()
		o := &observedWriter{ResponseWriter: w}
		ctx, span := tracing.Start(tracing.Extract(r.Context(), propagation.HeaderCarrier(r.Header)), pattern, trace.SpanKindServer)
		defer span.End()
		tp := spanTraceparent(span, r.Header.Get(bus.TraceparentHeader))
		h(o, r.WithContext(bus.WithTraceparent(ctx, tp)))
		a.record(calls, start, o.code, o.req, r.Header.Get("Authorization"), r.Method != http.MethodGet, o.msg, tp)
	}
}

// observeGRPC is the gRPC interceptor that does for the API's gRPC calls what observeHTTP does
// for HTTP routes.
func (a *API) observeGRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method, ok := strings.CutPrefix(info.FullMethod, "/"+apipb.RoomcastAPI_ServiceDesc.ServiceName+"/")
	if !ok {
		return h(ctx, req)
	}
	start := time.Now()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx, span := tracing.Start(tracing.Extract(ctx, tracing.MapCarrier(md)), method, trace.SpanKindServer)
	defer span.End()
	tp := spanTraceparent(span, mdFirst(ctx, bus.TraceparentHeader))
	resp, err := h(bus.WithTraceparent(ctx, tp), req)
	code, msg := clientpb.ErrorCode(0), ""
	if err != nil {
		code, msg = errorCodeOf(err)
	}
	m, _ := req.(proto.Message)
	a.record(a.m.callMetrics("grpc", method), start, code, m, mdFirst(ctx, "authorization"), mutates(method), msg, tp)
	return resp, err
}

// spanTraceparent returns the traceparent of a call's span, or with tracing off a new one
// under the caller's traceparent tp (bus.ChildTraceparent), for the audit record and the bus.
func spanTraceparent(span trace.Span, tp string) string {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return bus.ChildTraceparent(tp)
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// mutates reports whether a gRPC method changes something (and is audited).
func mutates(method string) bool {
	for _, read := range []string{"Get", "List", "Count", "Peek"} {
		if strings.HasPrefix(method, read) {
			return false
		}
	}
	return true
}

// callMetrics are one method's series, looked up once instead of at each call: its latency,
// and its calls answered OK, created at the first such answer (as WithLabelValues at each call
// would). Calls answered with an error are rarer and counted by their code at each.
type callMetrics struct {
	requests          *prometheus.CounterVec
	transport, method string
	latency           prometheus.Observer
	okOnce            sync.Once
	ok                prometheus.Counter
}

func (m *metrics) callMetrics(transport, method string) *callMetrics {
	return &callMetrics{requests: m.requests, transport: transport, method: method, latency: m.latency.WithLabelValues(transport, method)}
}

// count counts a call answered with code name.
func (c *callMetrics) count(name string) {
	if name != "OK" {
		c.requests.WithLabelValues(c.transport, c.method, name).Inc()
		return
	}
	c.okOnce.Do(func() { c.ok = c.requests.WithLabelValues(c.transport, c.method, "OK") })
	c.ok.Inc()
}

// record counts a call and, when it changes something, writes its audit record.
func (a *API) record(calls *callMetrics, start time.Time, code clientpb.ErrorCode, req proto.Message, authz string, audit bool, msg, traceparent string) {
	name := "OK"
	if code != 0 {
		name = codeName(code)
	}
	calls.count(name)
	calls.latency.Observe(time.Since(start).Seconds())
	level := slog.LevelInfo
	if code != 0 {
		level = slog.LevelWarn
	}
	if !audit || !a.audit.Enabled(context.Background(), level) {
		return // nothing to build the record for
	}
	attrs := append(a.auditCaller(calls, authz), targetOf(req)...)
	trace, _ := bus.TraceID(traceparent)
	attrs = append(attrs, slog.String("result", name), slog.String("trace_id", trace))
	if msg != "" {
		attrs = append(attrs, slog.String("error", msg))
	}
	a.audit.LogAttrs(context.Background(), level, "api call", attrs...)
}

// auditCaller is the start of an audit record: the call and the key that made it.
func (a *API) auditCaller(calls *callMetrics, authz string) []slog.Attr {
	key, _ := strings.CutPrefix(authz, "Bearer ")
	k, _ := a.lookupKey(key)
	return []slog.Attr{
		slog.String("transport", calls.transport), slog.String("method", calls.method),
		slog.String("app", k.App), slog.String("key", keyFingerprint(key)),
	}
}

// keyFingerprint names an API key in the audit log without giving it away: the first 8 hex
// digits of its SHA-256 ("" for none).
func keyFingerprint(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:4])
}

// targetOf returns the room, user, users, session and message a request names, as audit
// attributes.
func targetOf(req proto.Message) []slog.Attr {
	if req == nil {
		return nil
	}
	m := req.ProtoReflect()
	var out []slog.Attr
	for _, name := range []protoreflect.Name{"room", "uid", "uids", "session_id", "message_id"} {
		fd := m.Descriptor().Fields().ByName(name)
		if fd == nil || fd.Kind() != protoreflect.StringKind || !m.Has(fd) {
			continue
		}
		if fd.IsList() {
			list := m.Get(fd).List()
			uids := make([]string, list.Len())
			for i := range uids {
				uids[i] = list.Get(i).String()
			}
			out = append(out, slog.Any(string(name), uids))
			continue
		}
		out = append(out, slog.String(string(name), m.Get(fd).String()))
	}
	return out
}
