package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"roomcast/api"
	"roomcast/callback"
	"roomcast/cdnpusher"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles"
)

func runChatLink(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("chatlink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg roles.ChatLinkConfig
	bindNATSFlag(fs, &cfg.NATSURL)
	node := &cfg.Node
	fs.StringVar(&node.Node, "node", "", "this node's name, unique in the deployment (required; leased in JetStream KV)")
	fs.StringVar(&node.WSListen, "ws", "127.0.0.1:9101", "WebSocket listen address (path /v1/ws)")
	fs.StringVar(&node.TCPListen, "tcp", "127.0.0.1:9201", "TCP transport listen address")
	fs.StringVar(&node.PublicHost, "public-host", "", "host clients reach this node at (default: the listen host)")
	fs.StringVar(&node.PublicWSURL, "public-ws-url", "", "WebSocket URL to advertise instead of the listener's, e.g. wss://chat.example.com/v1/ws behind a TLS-terminating proxy")
	fs.StringVar(&node.PublicTCPAddr, "public-tcp-addr", "", "host:port to advertise for the TCP transport instead of the listener's")
	fs.BoolVar(&node.PublicTCPTLS, "public-tcp-tls", false, "advertise the TCP transport as TLS although this node serves it plain (a proxy at --public-tcp-addr terminates TLS)")
	bindTLSFlags(fs, &cfg.TLS, "--ws as wss:// and --tcp")
	fs.StringVar(&node.Region, "region", "", "region label for the dispatcher: CONTINENT/COUNTRY/SUBDIVISION in MaxMind's codes or a prefix of it, e.g. AS/CN/22 or EU/GB (docs/dispatch.md)")
	fs.StringVar(&node.ISP, "isp", "", "ISP label for the dispatcher, e.g. China Unicom")
	fs.StringVar(&node.Pool, "pool", "", "event pool label for the dispatcher: while its --reserve-pool names the pool, only that app's or room's clients are sent here (docs/dispatch.md)")
	fs.DurationVar(&node.DrainSpread, "drain-spread", chatlink.DefaultConfig().DrainSpread, "spread of reconnect delays when draining")
	limits := bindChatLinkFlags(fs, node)
	bindKVReplicasFlag(fs, &node.KVReplicas)
	fs.StringVar(&cfg.OpsListen, "ops", "127.0.0.1:9301", "address of /metrics, /healthz, /readyz, /livez and /debug/pprof/ (keep it private)")
	secrets := pairs{}
	fs.Var(secrets, "secret", "APP=SECRET: token secret of an app (repeatable, at least one; read again on SIGHUP and when its file changes, docs/configuration.md)")
	lifetimes := pairs{}
	fs.Var(lifetimes, "token-max-lifetime", "APP=DURATION: how far ahead a login token of the app may expire; later is refused (repeatable; default 24h)")
	logFlags := bindLogFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: roomcast chatlink --nats URL --node NAME --secret APP=SECRET [--tls-cert F --tls-key F] [flags]\n\nRuns one ChatLink edge node. SIGTERM or Ctrl-C drains it: clients are told to reconnect elsewhere.\n\n")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if node.Node == "" || len(secrets) == 0 {
		fmt.Fprintln(stderr, "roomcast chatlink: --node and at least one --secret are required")
		return 2
	}
	limits()
	node.Keys = keyring(secrets)
	node.MaxTokenLifetime = auth.Lifetimes{}
	for app, s := range lifetimes {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			fmt.Fprintf(stderr, "roomcast chatlink: --token-max-lifetime %s=%s: want a positive duration such as 24h\n", app, s)
			return 2
		}
		node.MaxTokenLifetime[app] = d
	}
	logs := &heldLog{out: stderr}
	log, audit, closeAudit, err := logFlags.loggers(logs, "chatlink")
	if err != nil {
		fmt.Fprintln(stderr, "roomcast chatlink:", err)
		return 2
	}
	defer closeAudit()
	node.Log, node.Audit = log, audit
	cl, err := roles.StartChatLink(cfg)
	if err != nil {
		logs.drop()
		return startFailed(stderr, "chatlink", err, map[string]string{"WebSocket": "--ws", "TCP": "--tcp", "ops": "--ops", "node": "--node"})
	}
	logs.release()
	// After a drain the node is down already: this stops the ops endpoint and the connection.
	defer func() { _ = cl.Shutdown(context.Background()) }()
	reloader, err := startReload(fs, log, cl.Registry, func() error {
		return reloadChatLink(fs, args, cl.Node, logFlags)
	}, func() []string { return nil })
	if err != nil {
		log.Error("configuration reloads off", "err", err)
	} else {
		defer reloader.Stop()
	}
	select {
	case <-ctx.Done():
		dctx, cancel := context.WithTimeout(context.Background(), node.DrainSpread+30*time.Second)
		defer cancel()
		if err := cl.Node.Drain(dctx, node.DrainSpread); err != nil {
			log.Warn("drain", "err", err)
		}
	case <-cl.Node.Drained():
	}
	return 0
}

func runServices(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("services", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg roles.ServicesConfig
	bindNATSFlag(fs, &cfg.NATSURL)
	bindServicesFlags(fs, &cfg.Listen, &cfg.GRPCListen, &cfg.Dispatcher.CityDB, &cfg.Dispatcher.ISPDB)
	bindRoomShareFlag(fs, &cfg.Dispatcher.RoomShare)
	bindNearRegionFlag(fs, &cfg.Dispatcher.NearRegions)
	reservations := bindReservePoolFlag(fs)
	fs.BoolVar(&cfg.Room.RequireCreated, "require-created", false, "refuse logins and sends to rooms never created through the API")
	bindRoomFlags(fs, &cfg.Room)
	bindInboxFlags(fs, &cfg.API.Inbox)
	bindAPILimitFlag(fs, &cfg.API.Limits.PerKey)
	bindQueueFlags(fs, &cfg.Queue)
	callbacks := bindCallbacksFlag(fs)
	bindTLSFlags(fs, &cfg.TLS, "--listen as HTTPS and --grpc-listen")
	corsOrigins := bindCORSFlag(fs, "")
	bindCDNManagerFlags(fs, &cfg.CDN)
	bindCDNWindowFlag(fs, &cfg.CDN.Window)
	var pusher cdnpusher.ServiceConfig
	bindS3Flags(fs, &pusher.Pusher)
	keys := apiKeys{}
	fs.Var(keys, "api-key", "KEY=APP or KEY=APP:SCOPE,SCOPE: a server API key, the app it acts for and the scopes of calls it may make, of send, moderate, read and admin (repeatable, at least one; without scopes: every scope; read again on SIGHUP and when its file changes, docs/configuration.md)")
	fs.StringVar(&cfg.OpsListen, "ops", "127.0.0.1:9501", "address of the ops endpoint: /metrics, the admin /v1/nodes, /healthz, /readyz, /livez and /debug/pprof/ (keep it private; empty: none)")
	fs.BoolVar(&cfg.PublicAdmin, "public-admin", false, "serve /metrics and the admin /v1/nodes on --listen too, as before --ops existed (compatibility only: they show anyone who reaches --listen your nodes)")
	bindKVReplicasFlag(fs, &cfg.KVReplicas)
	bindTrustedProxyFlag(fs, &cfg.Dispatcher.TrustedProxies)
	presenceFlags := bindPresenceFlags(fs)
	logFlags := bindLogFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: roomcast services --nats URL --api-key KEY=APP [--listen ADDR] [--grpc-listen ADDR] [--tls-cert F --tls-key F]\n\nRuns the room, presence and room queue services, the dispatcher, the server API (HTTP/JSON and gRPC) and the\nCDN manager, and with --s3-endpoint a CDN pusher too. Run as many as you like: they share the work\nthrough NATS queue groups and JetStream (one CDN manager leads).\n\n")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if len(keys) == 0 {
		fmt.Fprintln(stderr, "roomcast services: at least one --api-key is required")
		return 2
	}
	cfg.API.Keys = auth.APIKeys(keys)
	cfg.Dispatcher.Pools = *reservations
	if err := presenceFlags(&cfg.Presence); err != nil {
		fmt.Fprintln(stderr, "roomcast services:", err)
		return 2
	}
	var err error
	if cfg.Callbacks.Apps, err = callbacks(); err != nil {
		fmt.Fprintln(stderr, "roomcast services: --callbacks:", err)
		return 2
	}
	callbacksFile := fs.Lookup("callbacks").Value.String()
	if pusher.Pusher.Endpoint != "" {
		pusher.Pusher.Window = cfg.CDN.Window
		cfg.Pusher = &pusher
	}
	cfg.CORSOrigins = corsOrigins()
	logs := &heldLog{out: stderr}
	var closeAudit func()
	if cfg.Log, cfg.Audit, closeAudit, err = logFlags.loggers(logs, "services"); err != nil {
		fmt.Fprintln(stderr, "roomcast services:", err)
		return 2
	}
	defer closeAudit()
	s, err := roles.StartServices(cfg)
	if err != nil {
		logs.drop()
		return startFailed(stderr, "services", err, map[string]string{"HTTP": "--listen", "gRPC": "--grpc-listen", "ops": "--ops"})
	}
	logs.release()
	defer s.Close()
	reloader, err := startReload(fs, cfg.Log, s.Registry, func() error {
		return reloadServices(fs, args, s, logFlags, &callbacksFile)
	}, func() []string { return []string{callbacksFile} })
	if err != nil {
		cfg.Log.Error("configuration reloads off", "err", err)
	} else {
		defer reloader.Stop()
	}
	<-ctx.Done()
	return 0
}

// reloadChatLink reads the ChatLink's configuration again and applies its token secrets and log
// level, or nothing when they do not load.
func reloadChatLink(fs *flag.FlagSet, args []string, node interface{ SetKeys(auth.Keyring) error }, logFlags *logFlags) error {
	secrets, verbose := pairs{}, false
	if err := rereadFlags(fs, args, func(fs *flag.FlagSet) {
		fs.Var(secrets, "secret", "")
		fs.BoolVar(&verbose, "v", false, "")
	}); err != nil {
		return err
	}
	if err := node.SetKeys(keyring(secrets)); err != nil {
		return err
	}
	logFlags.setVerbose(verbose)
	return nil
}

// reloadServices reads the services' configuration again and applies its API keys, callbacks,
// pool reservations and log level, or nothing when any of them does not load. callbacksFile is the callbacks
// file in force, which a reload may name anew.
func reloadServices(fs *flag.FlagSet, args []string, s *roles.Services, logFlags *logFlags, callbacksFile *string) error {
	keys, file, verbose := apiKeys{}, "", false
	var pools poolReservations
	if err := rereadFlags(fs, args, func(fs *flag.FlagSet) {
		fs.Var(keys, "api-key", "")
		fs.Var(&pools, "reserve-pool", "")
		fs.StringVar(&file, "callbacks", "", "")
		fs.BoolVar(&verbose, "v", false, "")
	}); err != nil {
		return err
	}
	if len(keys) == 0 {
		return errors.New("no --api-key")
	}
	if err := dispatcher.CheckPools(pools); err != nil {
		return fmt.Errorf("--reserve-pool: %w", err)
	}
	for _, k := range keys {
		if err := api.CheckScopes(k.Scopes); err != nil {
			return fmt.Errorf("--api-key of app %q: %w", k.App, err)
		}
	}
	var apps map[string]callback.AppConfig
	if file != "" {
		if s.Callbacks == nil {
			return errors.New("--callbacks: the process started without callbacks: restart it to add them")
		}
		var err error
		if apps, err = callback.LoadFile(file); err != nil {
			return fmt.Errorf("--callbacks: %w", err)
		}
	}
	if s.Callbacks != nil {
		if err := s.Callbacks.SetApps(apps); err != nil {
			return fmt.Errorf("--callbacks: %w", err)
		}
	}
	if err := s.API.SetKeys(auth.APIKeys(keys)); err != nil {
		return err // not after the checks above
	}
	if !slices.Equal(pools, s.Dispatcher.Pools()) {
		if err := s.Dispatcher.SetPools(pools); err != nil {
			return fmt.Errorf("--reserve-pool: %w", err) // not after CheckPools above
		}
	}
	*callbacksFile = file
	logFlags.setVerbose(verbose)
	return nil
}

// keyring is the token secrets of --secret.
func keyring(secrets pairs) auth.Keyring {
	keys := auth.Keyring{}
	for app, s := range secrets {
		keys[app] = []byte(s)
	}
	return keys
}

func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var natsURL string
	bindNATSFlag(fs, &natsURL)
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
	nc, err := bus.Connect(natsURL, "roomcast drain", nil)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast drain:", err)
		return 1
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var rep buspb.Reply
	if err := bus.Request(rctx, nc, bus.DrainSubject(*node), &buspb.DrainRequest{
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
