// Package devcluster starts a whole Roomcast deployment in one process: an embedded NATS
// server with JetStream, the room and presence services (any number of instances of each), the
// dispatcher, the server API (HTTP/JSON and gRPC) and a number of ChatLinks, all the real components wired as in production. `roomcast dev` runs it,
// and tests use it as their cluster. It only wires; the components hold the logic.
package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/devnats"
	"roomcast/presence"
	"roomcast/room"
)

// The dev deployment's one app and its credentials. They are printed by `roomcast dev` and are
// for local use only.
const (
	App    = "demo"
	Secret = "roomcast-dev-secret"
	APIKey = "roomcast-dev-key"
)

// Config configures a dev cluster.
type Config struct {
	// DataDir holds JetStream's data. Required.
	DataDir string
	// Listen is the address of the HTTP endpoint (dispatch, server API, health, metrics, demo
	// page). Zero value means 127.0.0.1:0.
	Listen string
	// ChatLinks is how many ChatLink nodes to run, each on its own ports. Zero value means 2.
	ChatLinks int
	// NATSPort is the embedded NATS server's port. Zero value means a free port.
	NATSPort int
	// CityDB and ISPDB are the dispatcher's GeoIP databases (dispatcher.Config). Zero values
	// mean none: clients are dispatched on load alone. With either, SIGHUP reloads them.
	CityDB, ISPDB string
	// Home serves GET / (the demo page). Zero value means 404.
	Home http.Handler
	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the HTTP endpoint. It is
	// for finding where time goes on a dev machine: never set it where others can reach
	// the endpoint. Zero value means no profiles. Block and mutex profiles are empty unless
	// the process sets runtime.SetBlockProfileRate and runtime.SetMutexProfileFraction.
	Pprof bool
	// LoginTimeout and HeartbeatInterval are passed to every ChatLink. Zero values mean the
	// ChatLink defaults.
	LoginTimeout, HeartbeatInterval time.Duration
	// ChatLink, when set, adjusts each ChatLink's configuration before it starts.
	ChatLink func(*chatlink.Config)
	// ServiceInstances is how many instances of the room and presence services to run. Zero
	// value means 1.
	ServiceInstances int
	// LeaseInterval is how often a ChatLink reports (its lease); the services drop a node silent
	// for three intervals. Zero value means 1s.
	LeaseInterval time.Duration
	// GRPCListen is the address of the gRPC listener: the server API (roomcast.v1.RoomcastAPI)
	// and the dispatcher. Zero value means 127.0.0.1:0.
	GRPCListen string
	// APIKeys maps server API keys to apps. Zero value means {APIKey: App}.
	APIKeys auth.APIKeys
	// Presence configures the presence instances; its Bus, Log and LeaseTTL are set here.
	Presence presence.Config
	// RequireCreated refuses logins to rooms that were never created (room.Config). Zero value
	// means rooms open implicitly, as the demo page needs.
	RequireCreated bool
	// Log receives every component's logs. Zero value means none.
	Log *slog.Logger
}

// Cluster is a running dev deployment.
type Cluster struct {
	NATS       *server.Server
	Rooms      []*room.Service
	Presences  []*presence.Service
	Dispatcher *dispatcher.Dispatcher
	Nodes      []*chatlink.Node
	API        *room.API

	cfg     Config
	log     *slog.Logger
	connect func(name string) (*nats.Conn, error)
	grpcLn  net.Listener
	grpc    *grpc.Server
	grpcEnd chan struct{} // closed when the gRPC server has stopped
	conns   []*nats.Conn
	ln      net.Listener
	http    *http.Server
	served  chan struct{} // closed when the HTTP server has stopped
	closers []func()
	closed  bool
}

// Start brings a cluster up and returns once every ChatLink is known to the dispatcher.
// On error, whatever had started is stopped.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("devcluster: Config.DataDir is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.ChatLinks <= 0 {
		cfg.ChatLinks = 2
	}
	if cfg.ServiceInstances <= 0 {
		cfg.ServiceInstances = 1
	}
	if cfg.LeaseInterval <= 0 {
		cfg.LeaseInterval = time.Second
	}
	if cfg.GRPCListen == "" {
		cfg.GRPCListen = "127.0.0.1:0"
	}
	if cfg.APIKeys == nil {
		cfg.APIKeys = auth.APIKeys{APIKey: App}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c = &Cluster{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()

	c.NATS, err = devnats.Start(devnats.Config{Port: cfg.NATSPort, StoreDir: filepath.Join(cfg.DataDir, "nats")})
	if err != nil {
		return nil, err
	}
	c.closers = append(c.closers, func() { c.NATS.Shutdown(); c.NATS.WaitForShutdown() })
	connect := func(name string) (*nats.Conn, error) {
		// In the server's own process: a pipe instead of a loopback TCP connection, so what a
		// dev deployment spends on its bus is not the kernel's loopback round trips.
		nc, err := bus.Connect(c.NATS.ClientURL(), name, log, nats.InProcessServer(c.NATS))
		if err == nil {
			c.conns = append(c.conns, nc)
		}
		return nc, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	c.connect = connect
	for i := range cfg.ServiceInstances {
		r, err := c.startRoom(i)
		if r != nil {
			c.Rooms = append(c.Rooms, r)
		}
		if err != nil {
			return nil, err
		}
		p, err := c.startPresence(i)
		if p != nil {
			c.Presences = append(c.Presences, p)
		}
		if err != nil {
			return nil, err
		}
	}
	nc, err := connect("dispatcher")
	if err != nil {
		return nil, err
	}
	c.Dispatcher, err = dispatcher.New(dispatcher.Config{
		Bus: nc, CityDB: cfg.CityDB, ISPDB: cfg.ISPDB, ReloadOnSIGHUP: cfg.CityDB != "" || cfg.ISPDB != "",
		Registry: reg, Log: log,
	})
	if err != nil {
		return nil, err
	}
	if err = c.Dispatcher.Start(); err != nil {
		return nil, err
	}
	if nc, err = connect("api"); err != nil {
		return nil, err
	}
	api, err := room.NewAPI(room.APIConfig{Bus: nc, Keys: cfg.APIKeys, Log: log})
	if err != nil {
		return nil, err
	}
	c.API = api
	if c.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
		return nil, fmt.Errorf("devcluster: listen %s: %w", cfg.GRPCListen, err)
	}
	c.grpc = api.NewGRPCServer()
	c.Dispatcher.RegisterGRPC(c.grpc)
	c.grpcEnd = make(chan struct{})
	go func() {
		defer close(c.grpcEnd)
		_ = c.grpc.Serve(c.grpcLn)
	}()

	keys := auth.Keyring{App: []byte(Secret)}
	for i := 1; i <= cfg.ChatLinks; i++ {
		name := "cl-" + strconv.Itoa(i)
		if nc, err = connect("chatlink " + name); err != nil {
			return nil, err
		}
		ccfg := chatlink.Config{
			Node: name, Bus: nc, Keys: keys, Registry: reg, Log: log,
			// The nodes share this process's open files.
			MaxConnections: max(1000, (chatlink.FileLimit()-1024)/cfg.ChatLinks),
			LoginTimeout:   cfg.LoginTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
			ReportInterval: cfg.LeaseInterval,
		}
		if cfg.ChatLink != nil {
			cfg.ChatLink(&ccfg)
		}
		node, err := chatlink.New(ccfg)
		if err != nil {
			return nil, err
		}
		if err = node.Start(); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /v1/dispatch", c.Dispatcher)
	mux.Handle("/v1/rooms", api)
	mux.Handle("GET /v1/nodes", c.Dispatcher.NodesHandler())
	mux.Handle("/v1/rooms/", api)
	mux.Handle("/v1/users/", api)
	mux.Handle("/v1/online", api)
	mux.HandleFunc("GET /v1/dev/token", devToken)
	mux.HandleFunc("GET /healthz", c.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.Home != nil {
		mux.Handle("GET /{$}", cfg.Home)
	}
	if cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index) // and the named profiles: heap, block, mutex, ...
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if c.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("devcluster: listen %s: %w", cfg.Listen, err)
	}
	c.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute, // without it an idle keep-alive connection is kept forever
	}
	c.served = make(chan struct{})
	go func() {
		defer close(c.served)
		_ = c.http.Serve(c.ln)
	}()

	for c.Dispatcher.LiveNodes() < len(c.Nodes) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("devcluster: waiting for ChatLinks to report: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return c, nil
}

// URL returns the base URL of the HTTP endpoint, e.g. http://127.0.0.1:8080.
func (c *Cluster) URL() string { return "http://" + c.ln.Addr().String() }

// GRPCAddr returns the host:port of the gRPC listener: the server API and the dispatcher.
func (c *Cluster) GRPCAddr() string { return c.grpcLn.Addr().String() }

func (c *Cluster) leaseTTL() time.Duration { return 3 * c.cfg.LeaseInterval }

// startRoom starts room service instance i. It returns the service even when Start fails, so
// that Close can stop what started.
func (c *Cluster) startRoom(i int) (*room.Service, error) {
	nc, err := c.connect("room " + strconv.Itoa(i+1))
	if err != nil {
		return nil, err
	}
	r, err := room.New(room.Config{Bus: nc, Log: c.log, LeaseTTL: c.leaseTTL(), RequireCreated: c.cfg.RequireCreated})
	if err != nil {
		return nil, err
	}
	return r, r.Start()
}

func (c *Cluster) startPresence(i int) (*presence.Service, error) {
	nc, err := c.connect("presence " + strconv.Itoa(i+1))
	if err != nil {
		return nil, err
	}
	pcfg := c.cfg.Presence
	pcfg.Bus, pcfg.Log, pcfg.LeaseTTL = nc, c.log, c.leaseTTL()
	p, err := presence.New(pcfg)
	if err != nil {
		return nil, err
	}
	return p, p.Start()
}

// RestartRooms stops every room service instance and starts new ones, as a deploy would; the new
// ones know only what JetStream and the ChatLinks tell them.
func (c *Cluster) RestartRooms() error {
	for i, r := range c.Rooms {
		r.Close()
		var err error
		if c.Rooms[i], err = c.startRoom(i); err != nil {
			return err
		}
	}
	return nil
}

// RestartPresence does for the presence instances what RestartRooms does for the room ones.
func (c *Cluster) RestartPresence() error {
	for i, p := range c.Presences {
		p.Close()
		var err error
		if c.Presences[i], err = c.startPresence(i); err != nil {
			return err
		}
	}
	return nil
}

// NATSURL returns the embedded NATS server's client URL.
func (c *Cluster) NATSURL() string { return c.NATS.ClientURL() }

// Mint returns a login token for uid in room of the dev app.
func (c *Cluster) Mint(uid, room string, tags []string, ttl time.Duration) (string, error) {
	return auth.Mint([]byte(Secret), App, uid, room, tags, ttl)
}

// Close stops everything, ChatLinks first (their clients are closed with SHUTDOWN, a
// transient code: reconnect elsewhere). It may be called more than once.
func (c *Cluster) Close() {
	if c.closed {
		return
	}
	c.closed = true
	if c.http != nil {
		// Shutdown, unlike Close, waits for the connections' goroutines to finish.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := c.http.Shutdown(ctx); err != nil {
			_ = c.http.Close()
		}
		cancel()
		<-c.served
	}
	if c.grpc != nil {
		stopped := make(chan struct{})
		go func() { c.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(2 * time.Second):
			c.grpc.Stop()
			<-stopped
		}
		<-c.grpcEnd
	}
	for _, n := range c.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := n.Shutdown(ctx); err != nil {
			c.log.Warn("chatlink shutdown", "node", n.Name(), "err", err)
		}
		cancel()
	}
	if c.Dispatcher != nil {
		c.Dispatcher.Close()
	}
	for _, p := range c.Presences {
		if p != nil {
			p.Close()
		}
	}
	for _, r := range c.Rooms {
		if r != nil {
			r.Close()
		}
	}
	for _, nc := range c.conns {
		nc.Close()
	}
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
}

func (c *Cluster) healthz(w http.ResponseWriter, _ *http.Request) {
	d := c.Dispatcher.Health()
	status, code := "ok", http.StatusOK
	if d.Nodes == 0 || !c.NATS.Running() {
		status, code = "unavailable", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// dispatcher.mode is "load-only" when no GeoIP databases are configured.
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "chatlinks": d.Nodes, "dispatcher": d})
}

// devToken mints a token for the dev app: GET /v1/dev/token?uid=U&room=R. It exists only in
// dev deployments, for the demo page.
func devToken(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	tok, err := auth.Mint([]byte(Secret), App, r.URL.Query().Get("uid"), r.URL.Query().Get("room"), nil, time.Hour)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"token": tok, "app": App})
}
