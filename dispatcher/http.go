package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/clientip"
	"roomcast/internal/tracing"
)

// ServeHTTP answers GET /v1/dispatch (docs/protocol.md section 1): the client is the request's
// peer, or the address a trusted proxy forwarded.
func (d *Dispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	ip := d.clientOf(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), r.Header.Get("X-Real-IP"))
	q := r.URL.Query()
	req := Request{Client: ip, App: q.Get("app"), Room: q.Get("room")}
	span := startDispatchSpan(r.Context(), propagation.HeaderCarrier(r.Header), "http")
	ans, err := d.Dispatch(req)
	endDispatchSpan(span, req, ans, err)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, ErrBadRequest) {
			status = http.StatusBadRequest
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(ans)
}

// startDispatchSpan begins the server span of a dispatch call over transport ("http" or
// "grpc"), "dispatcher dispatch", in the trace its caller's traceparent (in carrier: the HTTP
// header or the gRPC metadata) names, or a new one. With tracing off it records nothing and
// costs nothing.
func startDispatchSpan(ctx context.Context, carrier propagation.TextMapCarrier, transport string) trace.Span {
	if !tracing.Enabled() {
		return trace.SpanFromContext(ctx)
	}
	_, span := tracing.Start(tracing.Extract(ctx, carrier), "dispatcher dispatch", trace.SpanKindServer,
		trace.WithAttributes(attribute.String("rpc.system", transport)))
	return span
}

// endDispatchSpan records a dispatch call's request and answer in its span, and ends it.
func endDispatchSpan(span trace.Span, req Request, ans Answer, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("roomcast.app", req.App), attribute.String("roomcast.room", req.Room),
			attribute.String("client.address", req.Client.String()), attribute.Int("roomcast.nodes", len(ans.Nodes)))
		if len(ans.Nodes) > 0 {
			span.SetAttributes(attribute.String("roomcast.node", ans.Nodes[0].Node))
		}
		if err != nil {
			span.SetStatus(otelcodes.Error, err.Error())
		}
	}
	span.End()
}

// clientOf picks the client's address and counts where it came from.
func (d *Dispatcher) clientOf(peer string, forwarded []string, realIP string) netip.Addr {
	ip, src := d.trusted.ClientAddr(peer, forwarded, realIP)
	d.m.clientAddr[src].Inc()
	return ip
}

// NodesHandler serves the admin view, GET /v1/nodes: every known node with its labels, last
// report and score inputs. With ?ip=ADDR it also shows where that address is placed and each
// node's score for it, best first; with ?app=APP&room=ROOM, the room's members per node as the
// dispatcher counts them (room affinity). It is for operators: serve it where clients cannot
// reach.
func (d *Dispatcher) NodesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		var client netip.Addr
		resp := map[string]any{}
		if s := r.URL.Query().Get("ip"); s != "" {
			a, ok := clientip.ParseHostAddr(strings.TrimSpace(s))
			if !ok {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": "ip must be an IPv4 or IPv6 address"})
				return
			}
			client = a
			loc := d.locate(a)
			resp["client"] = map[string]any{
				"ip":     a.String(),
				"region": regionLabel(d.in, loc.region),
				"isp":    d.ispLabel(loc),
			}
		}
		if q := r.URL.Query(); q.Has("app") || q.Has("room") {
			req := Request{App: q.Get("app"), Room: q.Get("room")}
			if err := req.check(); err != nil || req.App == "" {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": "app and room must both be valid names"})
				return
			}
			resp["room"] = map[string]any{"app": req.App, "room": req.Room, "members": d.rooms.held(roomKey{req.App, req.Room})}
		}
		resp["health"] = d.Health()
		resp["nodes"] = d.Nodes(client)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(resp)
	})
}

// ispLabel names a client's ISP keys for the admin view.
func (d *Dispatcher) ispLabel(l location) string {
	a, b := d.in.name(l.ispA), d.in.name(l.ispB)
	if a == b || b == "" {
		return a
	}
	if a == "" {
		return b
	}
	return a + "," + b
}
