// Package devcluster starts a whole Roomcast deployment in one process: an embedded NATS
// server with JetStream, the room and presence services, the dispatcher, the server API and a
// number of ChatLinks, all the real components wired as in production. `roomcast dev` runs it,
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
	// GRPCListen is the address of the dispatcher's gRPC endpoint. Zero value means
	// 127.0.0.1:0.
	GRPCListen string
	// CityDB and ISPDB are the dispatcher's GeoIP databases (dispatcher.Config). Zero values
	// mean none: clients are dispatched on load alone. With either, SIGHUP reloads them.
	CityDB, ISPDB string
	// Home serves GET / (the demo page). Zero value means 404.
	Home http.Handler
	// LoginTimeout and HeartbeatInterval are passed to every ChatLink. Zero values mean the
	// ChatLink defaults.
	LoginTimeout, HeartbeatInterval time.Duration
	// Log receives every component's logs. Zero value means none.
	Log *slog.Logger
}

// Cluster is a running dev deployment.
type Cluster struct {
	NATS       *server.Server
	Room       *room.Service
	Presence   *presence.Service
	Dispatcher *dispatcher.Dispatcher
	Nodes      []*chatlink.Node

	log     *slog.Logger
	conns   []*nats.Conn
	ln      net.Listener
	http    *http.Server
	served  chan struct{} // closed when the HTTP server has stopped
	grpcLn  net.Listener
	grpc    *grpc.Server
	grpcEnd chan struct{} // closed when the gRPC server has stopped
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
	if cfg.GRPCListen == "" {
		cfg.GRPCListen = "127.0.0.1:0"
	}
	if cfg.ChatLinks <= 0 {
		cfg.ChatLinks = 2
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c = &Cluster{log: log}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()

	c.NATS, err = bus.StartEmbedded(bus.EmbeddedConfig{Port: cfg.NATSPort, StoreDir: filepath.Join(cfg.DataDir, "nats")})
	if err != nil {
		return nil, err
	}
	c.closers = append(c.closers, func() { c.NATS.Shutdown(); c.NATS.WaitForShutdown() })
	connect := func(name string) (*nats.Conn, error) {
		nc, err := bus.Connect(c.NATS.ClientURL(), name, log)
		if err == nil {
			c.conns = append(c.conns, nc)
		}
		return nc, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	nc, err := connect("room")
	if err != nil {
		return nil, err
	}
	if c.Room, err = room.New(room.Config{Bus: nc, Log: log}); err != nil {
		return nil, err
	}
	if err = c.Room.Start(); err != nil {
		return nil, err
	}
	if nc, err = connect("presence"); err != nil {
		return nil, err
	}
	if c.Presence, err = presence.New(presence.Config{Bus: nc, Log: log}); err != nil {
		return nil, err
	}
	if err = c.Presence.Start(); err != nil {
		return nil, err
	}
	if nc, err = connect("dispatcher"); err != nil {
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
	api, err := room.NewAPI(room.APIConfig{Bus: nc, Keys: auth.APIKeys{APIKey: App}, Log: log})
	if err != nil {
		return nil, err
	}

	keys := auth.Keyring{App: []byte(Secret)}
	for i := 1; i <= cfg.ChatLinks; i++ {
		name := "cl-" + strconv.Itoa(i)
		if nc, err = connect("chatlink " + name); err != nil {
			return nil, err
		}
		node, err := chatlink.New(chatlink.Config{
			Node: name, Bus: nc, Keys: keys, Registry: reg, Log: log,
			LoginTimeout: cfg.LoginTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
		})
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
	mux.Handle("GET /v1/nodes", c.Dispatcher.NodesHandler())
	mux.Handle("/v1/rooms/", api)
	mux.HandleFunc("GET /v1/dev/token", devToken)
	mux.HandleFunc("GET /healthz", c.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.Home != nil {
		mux.Handle("GET /{$}", cfg.Home)
	}
	if c.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("devcluster: listen %s: %w", cfg.Listen, err)
	}
	c.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	c.served = make(chan struct{})
	go func() {
		defer close(c.served)
		_ = c.http.Serve(c.ln)
	}()

	if c.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
		return nil, fmt.Errorf("devcluster: listen %s: %w", cfg.GRPCListen, err)
	}
	c.grpc = grpc.NewServer()
	c.Dispatcher.RegisterGRPC(c.grpc)
	c.grpcEnd = make(chan struct{})
	go func() {
		defer close(c.grpcEnd)
		_ = c.grpc.Serve(c.grpcLn)
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

// GRPCAddr returns the host:port of the dispatcher's gRPC endpoint.
func (c *Cluster) GRPCAddr() string { return c.grpcLn.Addr().String() }

// NATSURL returns the embedded NATS server's client URL.
func (c *Cluster) NATSURL() string { return c.NATS.ClientURL() }

// Mint returns a login token for uid in room of the dev app.
func (c *Cluster) Mint(uid, room string, tags []string, ttl time.Duration) (string, error) {
	return auth.Mint([]byte(Secret), App, uid, room, tags, ttl)
}

// Close stops everything, ChatLinks first (their clients are told to reconnect). It may be
// called more than once.
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
	if c.Presence != nil {
		c.Presence.Close()
	}
	if c.Room != nil {
		c.Room.Close()
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
