package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"roomcast/api"
	"roomcast/callback"
	"roomcast/cdnmanager"
	"roomcast/cdnpusher"
	"roomcast/chatlink"
	"roomcast/console"
	"roomcast/dispatcher"
	"roomcast/internal/buspb"
	"roomcast/internal/certfiles"
	"roomcast/presence"
	"roomcast/room"
	"roomcast/roomqueue"
	"roomcast/store/roomstore"
)

// ServicesConfig configures the services role.
type ServicesConfig struct {
	// NATSURL is the NATS server's URL(s), comma-separated. Required.
	NATSURL string
	// NATSOptions add to the options of every NATS connection (bus.Connect); the dev assembly
	// passes nats.InProcessServer. Zero value means none.
	NATSOptions []nats.Option
	// Listen is the address of the public HTTP endpoint: dispatch, the server API, /healthz
	// (and with PublicAdmin /metrics and /v1/nodes). Zero value means 127.0.0.1:0.
	Listen string
	// GRPCListen is the address of the gRPC listener: the server API (roomcast.v1.RoomcastAPI)
	// and the dispatcher. Zero value means 127.0.0.1:0.
	GRPCListen string
	// Instances is how many instances of the room, presence and room queue services run in this process:
	// more than one lets the dev assembly and tests exercise the queue groups as several
	// processes would. Zero value means 1.
	Instances int
	// Room, Presence, Dispatcher and API configure the components; each one's Bus and Log are
	// set here, and the dispatcher's Registry. The dispatcher reloads its GeoIP databases on
	// SIGHUP when it has any (ReloadOnSIGHUP is set then).
	Room     room.Config
	Presence presence.Config
	// Queue configures the room queue instances (roomqueue); their Bus, Log and Registerer are
	// set here.
	Queue      roomqueue.Config
	Dispatcher dispatcher.Config
	API        api.Config
	// Callbacks configures the apps' login and send callbacks (package callback), one client
	// that every room instance of the process shares; its Log and Registerer are set here. Zero
	// value (Apps nil) means no client: no app is called back, and none can be later. An empty,
	// non-nil Apps starts a client with no hooks, to which Callbacks.SetApps may add some.
	Callbacks callback.Config
	// Registry receives the metrics and is served on /metrics. Zero value means a new registry
	// with the Go runtime's and the process's collectors.
	Registry *prometheus.Registry
	// Pprof serves Go's profiles under /debug/pprof/ on the HTTP endpoint: never where others
	// can reach it. Zero value means none (the ops endpoint serves them anyway).
	Pprof bool
	// KVReplicas, when set, is the replication of every KV bucket and stream the components
	// create or update (rooms, restrictions, member tags, history, the inbox, room queues,
	// presence's lease ends, CDN state): it overrides each component's own KVReplicas. Zero value means each
	// component's (1 unless set).
	KVReplicas int
	// OpsListen is the address of the private ops endpoint: /metrics, the admin /v1/nodes,
	// /healthz, /readyz, /livez and /debug/pprof/. Zero value means none.
	OpsListen string
	// PublicAdmin serves /metrics and the admin /v1/nodes on the public HTTP endpoint too, as
	// before the ops endpoint existed (the dev assembly, a local tool, sets it). Zero value
	// means only the ops endpoint serves them.
	PublicAdmin bool
	// Routes, when set, adds routes of the caller's to the HTTP endpoint (the dev assembly's
	// demo page and tokens).
	Routes func(*http.ServeMux)
	// CDN configures the CDN manager, which every services process runs (one instance leads);
	// its Bus, Log and Registerer are set here.
	CDN cdnmanager.Config
	// Pusher, when set, runs a CDN pusher instance in this process too; its Bus is set here,
	// its Logger and Registerer when unset. Zero value means none (pushers run as `roomcast
	// cdnpusher`).
	Pusher *cdnpusher.ServiceConfig
	// CDNOrigin, when set, serves segments under /cdn/ on the HTTP endpoint (the dev
	// assembly's embedded object store), and the endpoint's /cdn is the CDN's base URL when
	// CDN.BaseURLs names none.
	CDNOrigin http.Handler
	// TLS, when it names files, makes both endpoints TLS: HTTPS and gRPC over TLS, with the
	// certificate re-read when the files change (certfiles). Zero value means plaintext.
	TLS certfiles.Config
	// CORSOrigins are the web origins ("https://app.example.com") whose pages may call the
	// browser-facing routes from another origin: GET /v1/dispatch and CORSPaths. "*" allows
	// any; "self" the endpoint's own origins (its scheme and listen address, with localhost,
	// 127.0.0.1 and ::1 for a loopback one). Preflight OPTIONS requests are answered. Zero
	// value means none: browsers keep the answers from other origins' pages.
	CORSOrigins []string
	// CORSPaths are more paths (exact) CORSOrigins apply to, among those Routes adds. Zero
	// value means none.
	CORSPaths []string
	// Log receives every component's logs. Zero value means none.
	Log *slog.Logger
	// Audit receives the audit trail: the server API's calls that change something. Zero
	// value means Log.
	Audit *slog.Logger
}

func (c ServicesConfig) withDefaults() (ServicesConfig, error) {
	if c.NATSURL == "" {
		return c, errors.New("roles: ServicesConfig.NATSURL is required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.GRPCListen == "" {
		c.GRPCListen = "127.0.0.1:0"
	}
	if c.Instances <= 0 {
		c.Instances = 1
	}
	if c.Registry == nil {
		c.Registry = newRegistry()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.KVReplicas > 0 {
		c.Room.KVReplicas, c.API.KVReplicas, c.CDN.KVReplicas, c.Queue.KVReplicas = c.KVReplicas, c.KVReplicas, c.KVReplicas, c.KVReplicas
		c.Presence.KVReplicas = c.KVReplicas
		if c.Pusher != nil {
			pusher := *c.Pusher
			pusher.KVReplicas = c.KVReplicas
			c.Pusher = &pusher
		}
	}
	c.Dispatcher.ReloadOnSIGHUP = c.Dispatcher.ReloadOnSIGHUP || c.Dispatcher.CityDB != "" || c.Dispatcher.ISPDB != ""
	return c, nil
}

// Services is a running services role.
type Services struct {
	Rooms      []*room.Service
	Presences  []*presence.Service
	Queues     []*roomqueue.Service
	Dispatcher *dispatcher.Dispatcher
	API        *api.API
	CDN        *cdnmanager.Manager
	// Pusher is the CDN pusher instance of ServicesConfig.Pusher, or nil.
	Pusher *cdnpusher.Service
	// Callbacks is the room instances' callback client, or nil without callbacks.
	Callbacks *callback.Client
	// Registry is the one served on /metrics (ServicesConfig.Registry).
	Registry *prometheus.Registry
	// Console is the ops console, served beside the server API (it takes the same keys).
	Console *console.Console

	cfg       ServicesConfig
	bus       *busConns
	httpLn    net.Listener
	grpcLn    net.Listener
	ops       *opsEndpoint
	http      *httpServer
	grpc      *grpcServer
	localRoom localRoom
	closeOnce sync.Once
}

// localRoom is the process's first room service instance, the one started last (RestartRooms
// replaces it), which takes the server API's sends to rooms in the process (api.RoomSender).
type localRoom struct{ cur atomic.Pointer[room.Service] }

// SendLocalQueued implements api.RoomSender.
func (l *localRoom) SendLocalQueued(ctx context.Context, reqs []*buspb.SendRequest) (api.QueuedSend, bool) {
	if r := l.cur.Load(); r != nil {
		if q, ok := r.SendLocalQueued(ctx, reqs); ok {
			return q, true
		}
	}
	return nil, false
}

var _ api.QueuedSend = (*room.Queued)(nil)

// StartServices starts the services role and serves its HTTP and gRPC endpoints. On error,
// whatever had started is stopped.
func StartServices(cfg ServicesConfig) (_ *Services, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Services{cfg: cfg, Registry: cfg.Registry, bus: &busConns{url: cfg.NATSURL, opts: cfg.NATSOptions, log: cfg.Log}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// The certificate and the listeners first: a bad file or an address in use fails the
	// start before anything runs.
	var tlsCfg *tls.Config
	if cfg.TLS.Enabled() {
		if tlsCfg, err = serverTLS(cfg.TLS, cfg.Log); err != nil {
			return nil, err
		}
	}
	if s.httpLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, listenError("HTTP", cfg.Listen, err)
	}
	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
		return nil, listenError("gRPC", cfg.GRPCListen, err)
	}
	if s.ops, err = listenOps(cfg.OpsListen); err != nil {
		return nil, err
	}
	if cfg.Callbacks.Apps != nil {
		ccfg := cfg.Callbacks
		ccfg.Log, ccfg.Registerer = cfg.Log, cfg.Registry
		ccfg.MaxBodyBytes, ccfg.MaxTypeBytes = roomstore.MaxBodyBytes, roomstore.MaxTypeBytes
		if s.Callbacks, err = callback.New(ccfg); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Instances {
		r, err := s.startRoom(i)
		if r != nil {
			s.Rooms = append(s.Rooms, r)
		}
		if err != nil {
			return nil, err
		}
		p, err := s.startPresence(i)
		if p != nil {
			s.Presences = append(s.Presences, p)
		}
		if err != nil {
			return nil, err
		}
		q, err := s.startQueue(i)
		if q != nil {
			s.Queues = append(s.Queues, q)
		}
		if err != nil {
			return nil, err
		}
	}
	dcfg := cfg.Dispatcher
	if dcfg.Bus, err = s.bus.connect("dispatcher"); err != nil {
		return nil, err
	}
	dcfg.Registry, dcfg.Log = cfg.Registry, cfg.Log
	if s.Dispatcher, err = dispatcher.New(dcfg); err != nil {
		return nil, err
	}
	if err = s.Dispatcher.Start(); err != nil {
		return nil, err
	}
	mcfg := cfg.CDN
	if mcfg.Bus, err = s.bus.connect("cdnmanager"); err != nil {
		return nil, err
	}
	mcfg.Log, mcfg.Registerer = cfg.Log, cfg.Registry
	if cfg.CDNOrigin != nil && len(mcfg.BaseURLs) == 0 {
		mcfg.BaseURLs = []string{s.URL() + "/cdn"}
	}
	if s.CDN, err = cdnmanager.Start(mcfg); err != nil {
		return nil, err
	}
	if cfg.Pusher != nil {
		if s.Pusher, err = startPusherService(s.bus, *cfg.Pusher, cfg.Registry, cfg.Log); err != nil {
			return nil, err
		}
	}
	acfg := cfg.API
	if acfg.Bus, err = s.bus.connect("api"); err != nil {
		return nil, err
	}
	acfg.Log, acfg.Registerer = cfg.Log, cfg.Registry
	if acfg.Audit == nil {
		acfg.Audit = cfg.Audit
	}
	if len(s.Rooms) > 0 {
		acfg.Rooms = &s.localRoom // the API's sends to rooms skip the NATS round trip
	}
	if s.API, err = api.New(acfg); err != nil {
		return nil, err
	}

	ocfg := console.Config{
		Guard: s.API.Guard(api.ScopeAdmin), Nodes: func() any { return s.Dispatcher.Nodes(netip.Addr{}) },
		RoomCdn: s.API.RoomCdnOf, Log: cfg.Log,
		// No flag changes the ChatLinks' thresholds: they run with the defaults.
		FlowT1: chatlink.DefaultFlowT1, FlowT2: chatlink.DefaultFlowT2,
	}
	if ocfg.Bus, err = s.bus.connect("console"); err != nil {
		return nil, err
	}
	if s.Console, err = console.New(ocfg); err != nil {
		return nil, err
	}

	var grpcOpts []grpc.ServerOption
	if tlsCfg != nil {
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	grpcSrv := s.API.NewGRPCServer(grpcOpts...)
	s.Dispatcher.RegisterGRPC(grpcSrv)
	s.grpc = serveGRPC(s.grpcLn, grpcSrv, cfg.Log)
	cors := newCORSPolicy(cfg.CORSOrigins, selfOrigins(s.scheme(), s.httpLn.Addr()), append([]string{"/v1/dispatch"}, cfg.CORSPaths...))
	s.http = serveHTTP(s.httpLn, cors.wrap(jsonErrors(s.routes())), tlsCfg, cfg.Log)
	s.ops.serve(s.opsRoutes(), cfg.Log)
	return s, nil
}

// scheme is the HTTP endpoint's URL scheme.
func (s *Services) scheme() string {
	if s.cfg.TLS.Enabled() {
		return "https"
	}
	return "http"
}

// routes is the public HTTP endpoint's one route list.
func (s *Services) routes() *http.ServeMux {
	mux := http.NewServeMux()
	// A load balancer's health check stays on the public endpoint.
	mux.Handle("GET /healthz", healthHandler(s.health))
	if s.cfg.PublicAdmin {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
		mux.Handle("GET /v1/nodes", s.Dispatcher.NodesHandler())
	}
	if s.cfg.Pprof {
		addProfiles(mux)
	}
	mux.Handle("GET /v1/dispatch", s.Dispatcher)
	s.API.Register(mux)
	s.Console.Register(mux)
	if s.cfg.CDNOrigin != nil {
		mux.Handle("/cdn/", http.StripPrefix("/cdn", s.cfg.CDNOrigin))
	}
	if s.cfg.Routes != nil {
		s.cfg.Routes(mux)
	}
	return mux
}

// opsRoutes is the ops endpoint's route list: the admin routes and every role's.
func (s *Services) opsRoutes() *http.ServeMux {
	mux := newMux(s.Registry, s.health, s.bus.connected, true)
	mux.Handle("GET /v1/nodes", s.Dispatcher.NodesHandler())
	return mux
}

// OpsAddr returns the host:port of the ops endpoint, or "" without one.
func (s *Services) OpsAddr() string { return s.ops.addr() }

// health makes the services unavailable while a NATS connection is down or no ChatLink is
// known: a client sent here would find no node.
func (s *Services) health(h *Health) error {
	d := s.Dispatcher.Health()
	h.ChatLinks, h.Dispatcher = &d.Nodes, &d
	if err := s.bus.connected(); err != nil {
		return err
	}
	if d.Nodes == 0 {
		return errors.New("no live ChatLink")
	}
	return nil
}

// URL returns the base URL of the HTTP endpoint, e.g. http://127.0.0.1:8080 (https:// with
// TLS).
func (s *Services) URL() string { return s.scheme() + "://" + s.httpLn.Addr().String() }

// GRPCAddr returns the host:port of the gRPC listener.
func (s *Services) GRPCAddr() string { return s.grpcLn.Addr().String() }

// startRoom starts room service instance i. It returns the service even when Start fails, so
// that Close can stop what started.
func (s *Services) startRoom(i int) (*room.Service, error) {
	cfg := s.cfg.Room
	var err error
	if cfg.Bus, err = s.bus.connect("room " + strconv.Itoa(i+1)); err != nil {
		return nil, err
	}
	cfg.Log, cfg.Callbacks = s.cfg.Log, s.Callbacks
	// Instances in one process share the registry: each counts under its own label.
	cfg.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"instance": strconv.Itoa(i + 1)}, s.cfg.Registry)
	r, err := room.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Start(); err != nil {
		return r, err
	}
	if i == 0 {
		s.localRoom.cur.Store(r)
	}
	return r, nil
}

func (s *Services) startPresence(i int) (*presence.Service, error) {
	cfg := s.cfg.Presence
	var err error
	if cfg.Bus, err = s.bus.connect("presence " + strconv.Itoa(i+1)); err != nil {
		return nil, err
	}
	cfg.Log, cfg.Registerer = s.cfg.Log, s.cfg.Registry
	p, err := presence.New(cfg)
	if err != nil {
		return nil, err
	}
	return p, p.Start()
}

func (s *Services) startQueue(i int) (*roomqueue.Service, error) {
	cfg := s.cfg.Queue
	var err error
	if cfg.Bus, err = s.bus.connect("roomqueue " + strconv.Itoa(i+1)); err != nil {
		return nil, err
	}
	cfg.Log, cfg.Registerer = s.cfg.Log, s.cfg.Registry
	q, err := roomqueue.New(cfg)
	if err != nil {
		return nil, err
	}
	return q, q.Start()
}

// RestartRooms stops every room service instance and starts new ones, as a deploy would; the new
// ones know only what JetStream and the ChatLinks tell them.
func (s *Services) RestartRooms() error { return restart("room", s.Rooms, s.startRoom) }

// RestartPresence does for the presence instances what RestartRooms does for the room ones.
func (s *Services) RestartPresence() error {
	return restart("presence", s.Presences, s.startPresence)
}

// restart stops each instance and starts a new one in its place.
func restart[S interface{ Close() }](what string, instances []S, start func(i int) (S, error)) error {
	for i, old := range instances {
		old.Close()
		var err error
		if instances[i], err = start(i); err != nil {
			return fmt.Errorf("roles: restart %s %d: %w", what, i+1, err)
		}
	}
	return nil
}

// Close stops serving, then stops the components and closes their NATS connections. It may be
// called more than once.
func (s *Services) Close() {
	s.closeOnce.Do(func() {
		if s.http != nil {
			s.http.stop()
		} else if s.httpLn != nil {
			_ = s.httpLn.Close()
		}
		s.ops.stop()
		if s.grpc != nil {
			s.grpc.stop()
		} else if s.grpcLn != nil {
			_ = s.grpcLn.Close()
		}
		if s.Pusher != nil {
			// While the manager runs, so that it can hand the pusher's rooms over.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := s.Pusher.Shutdown(ctx); err != nil {
				s.cfg.Log.Warn("cdn pusher shutdown", "err", err)
			}
			cancel()
		}
		if s.CDN != nil {
			s.CDN.Close()
		}
		if s.Console != nil {
			s.Console.Close()
		}
		if s.Dispatcher != nil {
			s.Dispatcher.Close()
		}
		if s.Callbacks != nil {
			// Before the rooms: the calls it cuts short are answered (by the failure policy)
			// while the rooms' connections are up.
			s.Callbacks.Close()
		}
		for _, q := range s.Queues {
			if q != nil {
				q.Close()
			}
		}
		for _, p := range s.Presences {
			if p != nil {
				p.Close()
			}
		}
		for _, r := range s.Rooms {
			if r != nil {
				r.Close()
			}
		}
		s.bus.close()
	})
}
