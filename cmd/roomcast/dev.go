package main

import (
	"context"
	"embed"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
)

//go:embed web/index.html web/demo.js
var webFiles embed.FS

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("dev", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var cfg devcluster.Config
	flags.StringVar(&cfg.DataDir, "data", "roomcast-data", "directory for JetStream's data, locked while dev runs (one dev per directory)")
	flags.IntVar(&cfg.ChatLinks, "chatlinks", 2, "how many ChatLink nodes to run")
	flags.IntVar(&cfg.NATSPort, "nats-port", 0, "embedded NATS port (0: a free port)")
	bindServicesFlags(flags, &cfg.Listen, &cfg.GRPCListen, &cfg.Dispatcher.CityDB, &cfg.Dispatcher.ISPDB)
	bindRoomShareFlag(flags, &cfg.Dispatcher.RoomShare)
	limits := bindChatLinkFlags(flags, &cfg.ChatLink)
	labels := nodeLabels{}
	flags.Var(labels, "node-label", "NODE=REGION[:ISP]: label dev's ChatLink NODE (cl-1, cl-2, ...) for the dispatcher and the ops console, e.g. cl-1=AS/CN/22:unicom (repeatable; default: unlabelled)")
	bindRoomFlags(flags, &cfg.Room)
	bindInboxFlags(flags, &cfg.API.Inbox)
	bindAPILimitFlag(flags, &cfg.API.Limits.PerKey)
	bindQueueFlags(flags, &cfg.Queue)
	callbacks := bindCallbacksFlag(flags)
	bindTLSFlags(flags, &cfg.TLS, "every listener (the HTTP endpoint, gRPC, each ChatLink's wss:// and TCP)")
	corsOrigins := bindCORSFlag(flags, "self")
	logFlags := bindLogFlags(flags)
	bindCDNWindowFlag(flags, &cfg.CDN.Window)
	flags.Int64Var(&cfg.CDN.OnlineThreshold, "cdn-online-threshold", 0, "members online that put a room in CDN mode (0 or negative: never; clients that do not poll segments miss the moved lanes)")
	presenceFlags := bindPresenceFlags(flags)
	bindTrustedProxyFlag(flags, &cfg.Dispatcher.TrustedProxies)
	keys := apiKeys{devcluster.APIKey: {App: devcluster.App}}
	flags.Var(keys, "api-key", "KEY=APP:SCOPE,SCOPE: a server API key beside the dev key (which has every scope), e.g. a read-only one to try scopes: send, moderate, read, admin (repeatable)")
	flags.BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles under /debug/pprof/ on --listen, with block and mutex profiling on (costs some CPU; local use only)")
	flags.Usage = func() {
		fmt.Fprint(stderr, `Usage: roomcast dev [--listen 127.0.0.1:8080] [--data DIR] [--chatlinks 2] [--tls-cert F --tls-key F]

Runs everything in one process: an embedded NATS server with JetStream, the room, presence and
room queue services, the dispatcher, the server API, the CDN manager and a CDN pusher writing to an embedded
S3 store (in memory, served as a CDN origin under /cdn/), and --chatlinks ChatLink nodes (each
with a WebSocket and a TCP port), and serves a demo page. Ctrl-C shuts down cleanly. For local use only: the app,
secret and API key are fixed and printed.

`)
		flags.PrintDefaults()
	}
	if code := parseFlags(flags, args); code >= 0 {
		return code
	}
	cfg.CORSOrigins = corsOrigins()
	limits()
	if len(labels) > 0 {
		cfg.PerNode = func(c *chatlink.Config) {
			if l, ok := labels[c.Node]; ok {
				c.Region, c.ISP, _ = strings.Cut(l, ":")
			}
		}
	}
	cfg.API.Keys = auth.APIKeys(keys)
	if err := presenceFlags(&cfg.Presence); err != nil {
		fmt.Fprintln(stderr, "roomcast dev:", err)
		return 2
	}
	var err error
	if cfg.Callbacks.Apps, err = callbacks(); err != nil {
		fmt.Fprintln(stderr, "roomcast dev: --callbacks:", err)
		return 2
	}
	if cfg.ChatLinks < 1 || cfg.ChatLinks > 64 {
		fmt.Fprintln(stderr, "roomcast dev: --chatlinks must be 1 to 64")
		return 2
	}
	if err := checkWritable(cfg.DataDir); err != nil {
		fmt.Fprintf(stderr, "roomcast dev: --data %s is not a writable directory: %v (choose one this user can write with --data)\n",
			cfg.DataDir, strings.Join(strings.Fields(err.Error()), " "))
		return 1
	}
	logs := &heldLog{out: stderr}
	var closeAudit func()
	if cfg.Log, cfg.Audit, closeAudit, err = logFlags.loggers(logs, "dev"); err != nil {
		fmt.Fprintln(stderr, "roomcast dev:", err)
		return 2
	}
	defer closeAudit()
	page, err := fs.Sub(webFiles, "web")
	if err != nil {
		fmt.Fprintln(stderr, "roomcast dev:", err)
		return 1
	}
	cfg.Home = http.FileServerFS(page)

	startCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	c, err := devcluster.Start(startCtx, cfg)
	cancel()
	if err != nil {
		if logFlags.verbose {
			logs.release()
		} else {
			logs.drop()
		}
		return startFailed(stderr, "dev", err, map[string]string{"HTTP": "--listen", "gRPC": "--grpc-listen", "NATS": "--nats-port"})
	}
	logs.release()
	if cfg.Pprof {
		// After Start: the embedded NATS server sets the block profile rate (to its own
		// option, 0) when it starts. One sample per 10µs spent blocked and one mutex
		// contention event in 100: enough to see a serial stage under load without slowing
		// the server much.
		runtime.SetBlockProfileRate(int((10 * time.Microsecond).Nanoseconds()))
		runtime.SetMutexProfileFraction(100)
	}
	printBanner(stdout, c, cfg.DataDir)
	<-ctx.Done()
	fmt.Fprintln(stdout, "roomcast dev: shutting down")
	c.Close()
	return 0
}

// nodeLabels maps dev's ChatLinks to their REGION[:ISP] labels (--node-label).
type nodeLabels map[string]string

func (l nodeLabels) String() string {
	out := make([]string, 0, len(l))
	for node, label := range l {
		out = append(out, node+"="+label)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func (l nodeLabels) Set(v string) error {
	node, label, ok := strings.Cut(v, "=")
	if !ok || node == "" || label == "" || strings.HasPrefix(label, ":") {
		return fmt.Errorf("want NODE=REGION[:ISP], got %q", v)
	}
	l[node] = label
	return nil
}

func printBanner(w io.Writer, c *devcluster.Cluster, data string) {
	abs, err := filepath.Abs(data)
	if err != nil {
		abs = data
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Roomcast dev is running.\n\n")
	fmt.Fprintf(&b, "  demo page     %s/\n", c.URL())
	fmt.Fprintf(&b, "  dispatch      %s/v1/dispatch   gRPC %s   nodes %s/v1/nodes   (%s)\n",
		c.URL(), c.GRPCAddr(), c.URL(), c.Dispatcher.Health().Mode)
	fmt.Fprintf(&b, "  server API    %s/v1/rooms/{room}/messages   (API key %s)\n", c.URL(), devcluster.APIKey)
	fmt.Fprintf(&b, "  ops console   %s/console   (an API key with the admin scope; docs/operations.md)\n", c.URL())
	fmt.Fprintf(&b, "  server gRPC   %s   (roomcast.v1.RoomcastAPI, docs/api.md)\n", c.GRPCAddr())
	fmt.Fprintf(&b, "  health        %s/healthz   metrics %s/metrics\n", c.URL(), c.URL())
	fmt.Fprintf(&b, "  NATS          %s   (JetStream data in %s)\n", c.NATSURL(), abs)
	fmt.Fprintf(&b, "  CDN origin    %s/{app}/{room}/{window_ms}/{index}   (segments; embedded S3 %s, bucket %s; docs/cdn.md)\n",
		c.CDNOrigin(), c.S3.Endpoint(), c.S3.Bucket())
	for _, n := range c.Nodes {
		tcp := "tcp"
		if n.TCPTLS() {
			tcp = "tcp+tls"
		}
		fmt.Fprintf(&b, "  chatlink %-5s %s   %s %s\n", n.Name(), n.WSURL(), tcp, n.TCPAddr())
	}
	fmt.Fprintf(&b, "\n  app %q, token secret %q\n\n", devcluster.App, devcluster.Secret)
	fmt.Fprintf(&b, "Mint a token:\n  go run ./cmd/roomcast token --secret %s --app %s --uid alice --room lobby\n", devcluster.Secret, devcluster.App)
	fmt.Fprintf(&b, "Send to a room:\n  curl -H 'Authorization: Bearer %s' -d '{\"body\":\"hello\"}' %s/v1/rooms/lobby/messages\n", devcluster.APIKey, c.URL())
	fmt.Fprintf(&b, "Put a room's bulk lane on the CDN:\n  curl -X PUT -H 'Authorization: Bearer %s' -d '{\"mode\":\"CDN_MODE_BULK\"}' %s/v1/rooms/lobby/cdn\n", devcluster.APIKey, c.URL())
	fmt.Fprintf(&b, "Check it end to end:\n  go run ./cmd/roomcast probe --dispatcher %s --room r1 --clients 4 --messages 25\n\nCtrl-C stops.\n", c.URL())
	fmt.Fprint(w, b.String())
}
