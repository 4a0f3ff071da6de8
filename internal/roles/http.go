package roles

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"roomcast/api"
	"roomcast/dispatcher"
	"roomcast/proto/clientpb"
)

// stopTimeout bounds how long an HTTP or gRPC server waits for its calls in flight to end
// before it closes them.
const stopTimeout = 2 * time.Second

// Health is the body of every role's GET /healthz (and /readyz and /livez, which fill only
// Status and Error), one shape for all of them: Status is "ok"
// (HTTP 200) or "unavailable" (HTTP 503, with Error saying why); the other fields are the
// role's own and left out by the roles that have none.
type Health struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// ChatLinks is how many ChatLinks the services' dispatcher knows live.
	ChatLinks *int `json:"chatlinks,omitempty"`
	// Dispatcher is the services' dispatcher.Health (its mode is "load-only" without GeoIP
	// databases).
	Dispatcher *dispatcher.Health `json:"dispatcher,omitempty"`
	// Node is a ChatLink's name, Connections its open client connections.
	Node        string `json:"node,omitempty"`
	Connections *int   `json:"connections,omitempty"`
}

// newMux returns a mux with the routes every role's ops endpoint has: GET /metrics from reg,
// GET /healthz from health (which fills h and returns why the role is unavailable, or nil),
// GET /readyz from ready (nil: this process's engines are connected and serving, so traffic
// may come), GET /livez (the process answers: restart it if not) and, with profiles, Go's
// profiles under /debug/pprof/.
func newMux(reg prometheus.Gatherer, health func(h *Health) error, ready func() error, profiles bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /healthz", healthHandler(health))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		writeHealth(w, &Health{Status: "ok"}, ready())
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		writeHealth(w, &Health{Status: "ok"}, nil)
	})
	if profiles {
		addProfiles(mux)
	}
	return mux
}

// healthHandler answers GET /healthz from health.
func healthHandler(health func(h *Health) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := Health{Status: "ok"}
		writeHealth(w, &h, health(&h))
	})
}

// addProfiles serves Go's profiles under /debug/pprof/. The index serves the named profiles
// too: heap, block, mutex, goroutine, ... Not /debug/pprof/cmdline: a command line holds
// secrets (--secret).
func addProfiles(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// jsonErrors answers a request no route of mux takes as the API answers its errors (api.ErrorBody,
// code 100 BAD_REQUEST) with the mux's own status: 404 for an unknown path, 405 with Allow for
// a method the path does not take. Without it net/http would answer in plain text.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		answer := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(answer, r)
		if answer.status != http.StatusNotFound && answer.status != http.StatusMethodNotAllowed {
			mux.ServeHTTP(w, r) // a redirect to the path with a trailing slash
			return
		}
		msg := fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)
		if allow := answer.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
			msg = fmt.Sprintf("%s does not take %s, only %s", r.URL.Path, r.Method, allow)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(answer.status)
		_ = json.NewEncoder(w).Encode(api.ErrorBody{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Name: "BAD_REQUEST", Error: msg})
	})
}

// statusRecorder keeps the status and headers a handler answers with, and drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header { return s.header }

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return len(p), nil
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
}

// writeHealth answers a health, readiness or liveness check: 200 with h, or with err 503 and
// h's status "unavailable" and error.
func writeHealth(w http.ResponseWriter, h *Health, err error) {
	code := http.StatusOK
	if err != nil {
		h.Status, h.Error, code = "unavailable", err.Error(), http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

// httpServer serves HTTP on a listener until stop.
type httpServer struct {
	srv  *http.Server
	done chan struct{} // closed when Serve has returned
}

// serveHTTP serves h on ln: HTTPS with tlsCfg, else plain HTTP.
func serveHTTP(ln net.Listener, h http.Handler, tlsCfg *tls.Config, log *slog.Logger) *httpServer {
	s := &httpServer{
		srv: &http.Server{
			Handler:           h,
			TLSConfig:         tlsCfg,
			ReadHeaderTimeout: 5 * time.Second,
			IdleTimeout:       2 * time.Minute, // without it an idle keep-alive connection is kept forever
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		serve := s.srv.Serve
		if tlsCfg != nil {
			serve = func(ln net.Listener) error { return s.srv.ServeTLS(ln, "", "") } // the certificate comes from tlsCfg
		}
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("serving", "addr", ln.Addr().String())
	return s
}

// stop lets calls in flight end for stopTimeout, then closes their connections.
func (s *httpServer) stop() {
	// Shutdown, unlike Close, waits for the connections' goroutines to finish.
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}

// grpcServer serves gRPC on a listener until stop.
type grpcServer struct {
	srv  *grpc.Server
	done chan struct{} // closed when Serve has returned
}

func serveGRPC(ln net.Listener, srv *grpc.Server, log *slog.Logger) *grpcServer {
	s := &grpcServer{srv: srv, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := srv.Serve(ln); err != nil {
			log.Error("grpc server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("serving gRPC", "addr", ln.Addr().String())
	return s
}

// stop lets calls in flight end for stopTimeout, then cancels them: GracefulStop alone would
// wait for a stream that never ends.
func (s *grpcServer) stop() {
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		s.srv.Stop()
		<-stopped
	}
	<-s.done
}

// opsEndpoint is a role's private HTTP endpoint (/metrics, /healthz, profiles): it listens
// before the role starts, so that an address in use fails the start early, and serves once the
// role runs. A nil *opsEndpoint is a role without one.
type opsEndpoint struct {
	ln  net.Listener
	srv *httpServer // nil until serve
}

// listenOps listens on addr; "" means no endpoint (nil).
func listenOps(addr string) (*opsEndpoint, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, listenError("ops", addr, err)
	}
	return &opsEndpoint{ln: ln}, nil
}

func (o *opsEndpoint) serve(mux *http.ServeMux, log *slog.Logger) {
	if o != nil {
		o.srv = serveHTTP(o.ln, jsonErrors(mux), nil, log)
	}
}

// addr returns the endpoint's host:port, or "" without one.
func (o *opsEndpoint) addr() string {
	if o == nil {
		return ""
	}
	return o.ln.Addr().String()
}

// stop stops serving, or closes the listener of an endpoint that never served.
func (o *opsEndpoint) stop() {
	switch {
	case o == nil:
	case o.srv != nil:
		o.srv.stop()
	default:
		_ = o.ln.Close()
	}
}
