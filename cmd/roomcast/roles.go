package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"roomcast/api"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/presence"
	pb "roomcast/proto/roomcastpb"
	"roomcast/room"
)

// pairs is a repeatable flag of KEY=VALUE pairs.
type pairs map[string]string

func (p pairs) String() string { return fmt.Sprint(map[string]string(p)) }

func (p pairs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || v == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	p[k] = v
	return nil
}

// parseFlags parses args, printing usage on --help; it returns the exit code to use when the
// caller should stop (0 after --help, 2 after a bad flag) and -1 to go on.
func parseFlags(fs *flag.FlagSet, args []string) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "roomcast %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2
	}
	return -1
}

// serveOps serves /metrics and /healthz on addr until ctx ends.
func serveOps(addr string, reg *prometheus.Registry, healthy func() error, log *slog.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Profiles for operators, on the ops address (loopback unless configured otherwise).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	return serveHTTP(addr, mux, log)
}

func serveHTTP(addr string, h http.Handler, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute, // without it an idle keep-alive connection is kept forever
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "addr", addr, "err", err)
		}
	}()
	log.Info("serving", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func runChatLink(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("chatlink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	var cfg chatlink.Config
	fs.StringVar(&cfg.Node, "node", "", "this node's name, unique in the deployment (required; leased in JetStream KV)")
	fs.StringVar(&cfg.WSListen, "ws", "127.0.0.1:9101", "WebSocket listen address (path /v1/ws)")
	fs.StringVar(&cfg.TCPListen, "tcp", "127.0.0.1:9201", "TCP transport listen address")
	fs.StringVar(&cfg.PublicHost, "public-host", "", "host clients reach this node at (default: the listen host)")
	fs.StringVar(&cfg.Region, "region", "", "region label for the dispatcher, e.g. CN-22")
	fs.StringVar(&cfg.ISP, "isp", "", "ISP label for the dispatcher, e.g. China Unicom")
	fs.Float64Var(&cfg.EgressCapacity, "egress-capacity", 0, "egress capacity in bytes per second, the base of flow control (0: unlimited)")
	fs.DurationVar(&cfg.FlushTick, "flush-tick", 0, "default flush tick of rooms (0: 100ms)")
	fs.IntVar(&cfg.PhaseMembers, "phase-members", 0, "members of a room per flush phase: a bigger room's flushes are spread over the tick in up to 16 phases (0: 1024)")
	fs.BoolVar(&cfg.PlainWrites, "plain-writes", false, "keep the writers from before io_uring batch sends: gws for WebSocket, a system call per frame (for comparison; also what a node without io_uring does)")
	fs.BoolVar(&cfg.ReaderGoroutines, "reader-goroutines", false, "give every WebSocket connection a reader goroutine instead of reading from the node's epoll poller (for comparison; more memory per idle connection)")
	fs.DurationVar(&cfg.DrainSpread, "drain-spread", 0, "spread of reconnect delays when draining (0: 10s)")
	opsAddr := fs.String("ops", "127.0.0.1:9301", "address of /metrics, /healthz and /debug/pprof/ (keep it private)")
	secrets := pairs{}
	fs.Var(secrets, "secret", "APP=SECRET: token secret of an app (repeatable, at least one)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: roomcast chatlink --nats URL --node NAME --secret APP=SECRET [flags]\n\nRuns one ChatLink edge node. SIGTERM or Ctrl-C drains it: clients are told to reconnect elsewhere.\n\n")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if cfg.Node == "" || len(secrets) == 0 {
		fmt.Fprintln(stderr, "roomcast chatlink: --node and at least one --secret are required")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg.Keys = auth.Keyring{}
	for app, s := range secrets {
		cfg.Keys[app] = []byte(s)
	}
	nc, err := bus.Connect(*natsURL, "chatlink "+cfg.Node, log)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast chatlink:", err)
		return 1
	}
	defer nc.Close()
	reg := newRegistry()
	cfg.Bus, cfg.Registry, cfg.Log = nc, reg, log
	node, err := chatlink.New(cfg)
	if err == nil {
		err = node.Start()
	}
	if err != nil {
		fmt.Fprintln(stderr, "roomcast chatlink:", err)
		return 1
	}
	stopOps, err := serveOps(*opsAddr, reg, func() error {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	}, log)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast chatlink:", err)
		_ = node.Shutdown(context.Background())
		return 1
	}
	defer stopOps()
	select {
	case <-ctx.Done():
		dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainSpread+30*time.Second)
		defer cancel()
		if err := node.Drain(dctx, cfg.DrainSpread); err != nil {
			log.Warn("drain", "err", err)
		}
	case <-node.Drained():
	}
	return 0
}

func runServices(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("services", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address: /v1/dispatch, the server API, /metrics, /healthz")
	grpcListen := fs.String("grpc-listen", "127.0.0.1:9090", "address of the server API's gRPC listener")
	requireCreated := fs.Bool("require-created", false, "refuse logins and sends to rooms never created through the API")
	cityDB := fs.String("geoip-city", "", "GeoIP2/GeoLite2 City or Country database for the dispatcher (empty: dispatch on load alone)")
	ispDB := fs.String("geoip-isp", "", "GeoIP2 ISP or GeoLite2 ASN database for the dispatcher")
	keys := pairs{}
	fs.Var(keys, "api-key", "KEY=APP: a server API key and the app it acts for (repeatable, at least one)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: roomcast services --nats URL --api-key KEY=APP [--listen ADDR] [--grpc-listen ADDR]\n\nRuns the room and presence services, the dispatcher and the server API (HTTP/JSON and gRPC). Run as\nmany as you like: they share the work through NATS queue groups and JetStream.\n\n")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if len(keys) == 0 {
		fmt.Fprintln(stderr, "roomcast services: at least one --api-key is required")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	connect := func(name string) (*nats.Conn, error) {
		nc, err := bus.Connect(*natsURL, name, log)
		if err == nil {
			conns = append(conns, nc)
		}
		return nc, err
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "roomcast services:", err)
		return 1
	}
	nc, err := connect("room")
	if err != nil {
		return fail(err)
	}
	rs, err := room.New(room.Config{Bus: nc, Log: log, RequireCreated: *requireCreated})
	if err == nil {
		err = rs.Start()
	}
	if err != nil {
		return fail(err)
	}
	defer rs.Close()
	if nc, err = connect("presence"); err != nil {
		return fail(err)
	}
	ps, err := presence.New(presence.Config{Bus: nc, Log: log})
	if err == nil {
		err = ps.Start()
	}
	if err != nil {
		return fail(err)
	}
	defer ps.Close()
	if nc, err = connect("dispatcher"); err != nil {
		return fail(err)
	}
	reg := newRegistry()
	d, err := dispatcher.New(dispatcher.Config{
		Bus: nc, CityDB: *cityDB, ISPDB: *ispDB, ReloadOnSIGHUP: *cityDB != "" || *ispDB != "",
		Registry: reg, Log: log,
	})
	if err == nil {
		err = d.Start()
	}
	if err != nil {
		return fail(err)
	}
	defer d.Close()
	if nc, err = connect("api"); err != nil {
		return fail(err)
	}
	apiKeys := auth.APIKeys{}
	for k, app := range keys {
		apiKeys[k] = app
	}
	serverAPI, err := api.New(api.Config{Bus: nc, Keys: apiKeys, Log: log})
	if err != nil {
		return fail(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/dispatch", d)
	mux.Handle("GET /v1/nodes", d.NodesHandler())
	serverAPI.Register(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := d.Health()
		w.Header().Set("Content-Type", "application/json")
		if h.Nodes == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"chatlinks": h.Nodes, "dispatcher": h})
	})
	stop, err := serveHTTP(*listen, mux, log)
	if err != nil {
		return fail(err)
	}
	defer stop()
	grpcLn, err := net.Listen("tcp", *grpcListen)
	if err != nil {
		return fail(err)
	}
	grpcSrv := serverAPI.NewGRPCServer()
	d.RegisterGRPC(grpcSrv)
	grpcDone := make(chan struct{})
	go func() {
		defer close(grpcDone)
		_ = grpcSrv.Serve(grpcLn)
	}()
	defer func() { grpcSrv.GracefulStop(); <-grpcDone }()
	log.Info("serving gRPC", "addr", grpcLn.Addr().String())
	<-ctx.Done()
	return 0
}

func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", "nats://127.0.0.1:4222", "NATS server URL")
	node := fs.String("node", "", "name of the ChatLink to drain (required)")
	spread := fs.Duration("spread", 0, "spread of the clients' reconnect delays (0: the node's default, 10s)")
	deadline := fs.Duration("deadline", 0, "how long to wait for clients to leave before closing the rest (0: spread + 30s)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: roomcast drain --nats URL --node NAME [--spread 10s] [--deadline 40s]\n\nAsks a ChatLink to drain: it stops taking logins, tells its clients to reconnect elsewhere after\nspread-out delays, and shuts down once they are gone or at the deadline.\n\n")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if *node == "" {
		fmt.Fprintln(stderr, "roomcast drain: --node is required")
		return 2
	}
	nc, err := bus.Connect(*natsURL, "roomcast drain", nil)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast drain:", err)
		return 1
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var rep pb.Reply
	if err := bus.Request(rctx, nc, bus.DrainSubject(*node), &pb.DrainRequest{
		SpreadMs: uint32(spread.Milliseconds()), DeadlineMs: uint32(deadline.Milliseconds()),
	}, &rep); err != nil {
		fmt.Fprintf(stderr, "roomcast drain: node %q did not answer: %v\n", *node, err)
		return 1
	}
	if rep.Code != 0 {
		fmt.Fprintln(stderr, "roomcast drain:", rep.Message)
		return 1
	}
	fmt.Fprintf(stdout, "node %s is draining\n", *node)
	return 0
}
