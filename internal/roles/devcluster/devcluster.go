// Package devcluster starts a whole Roomcast deployment in one process: an embedded NATS server
// with JetStream (internal/roles/devnats), an embedded S3 store (internal/roles/devs3), the
// services role (the room, presence and room queue services, any number of instances of each, the
// dispatcher, the server API over HTTP/JSON and gRPC, the CDN manager and a CDN pusher writing to
// the embedded store, whose segments the HTTP endpoint serves under /cdn/ as a CDN origin) and a
// number of ChatLinks, each role started by internal/roles as production starts it. `roomcast dev`
// runs it, and tests use it as their cluster. It only assembles: the roles hold the wiring and the
// components the logic.
package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/api"
	"roomcast/callback"
	"roomcast/cdnmanager"
	"roomcast/cdnpusher"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/certfiles"
	"roomcast/internal/osdep"
	"roomcast/internal/roles"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/roles/devs3"
	"roomcast/presence"
	"roomcast/room"
	"roomcast/roomqueue"
)

// The dev deployment's one app and its credentials. They are printed by `roomcast dev` and are
// for local use only.
const (
	App    = "demo"
	Secret = "roomcast-dev-secret"
	APIKey = "roomcast-dev-key"
)

// Config configures a dev cluster. Its first fields shape the deployment; the rest are the
// components' own configurations, whose zero values are each component's production defaults
// (chatlink.DefaultLimits and the others' DefaultConfig or documented zero values), so a dev
// deployment and the tests on it run what production runs unless they set a field. The
// cluster sets what ties a component to it: its bus connection, logs and metrics, a ChatLink's
// name and keys, the leases' timing.
type Config struct {
	// DataDir holds JetStream's data; the cluster locks it while it runs (ErrDataDirInUse).
	// Required.
	DataDir string
	// Listen is the address of the HTTP endpoint (dispatch, server API, health, metrics, demo
	// page). Zero value means 127.0.0.1:0.
	Listen string
	// GRPCListen is the address of the gRPC listener: the server API (roomcast.v1.RoomcastAPI)
	// and the dispatcher. Zero value means 127.0.0.1:0.
	GRPCListen string
	// NATSPort is the embedded NATS server's port. Zero value means a free port.
	NATSPort int
	// NATSURL, when set, is a NATS deployment with JetStream (URLs, comma-separated) the
	// cluster connects to instead of starting one of its own: the services connect there, and
	// the ChatLinks unless NodeNATSURL says otherwise. NATSPort is ignored then, and Cluster.NATS
	// is nil. Zero value means the embedded server.
	NATSURL string
	// NodeNATSURL, when set, returns the NATS URLs ChatLink i (from 1) connects to: in a
	// multi-region test (internal/testkit/regions) its region's servers. Zero value means the
	// services' NATS.
	NodeNATSURL func(i int) string
	// ChatLinks is how many ChatLink nodes to run, each on its own ports. Zero value means 2.
	ChatLinks int
	// ServiceInstances is how many instances of the room, presence and room queue services to
	// run. Zero value means 1.
	ServiceInstances int
	// LeaseInterval is how often a ChatLink reports (its lease, ChatLink.ReportInterval); the
	// services drop a node silent for three intervals (Room.LeaseTTL, Presence.LeaseTTL). Zero
	// value means 1s.
	LeaseInterval time.Duration
	// TLS, when it names files, makes every listener TLS with that certificate: the HTTP
	// endpoint (https://), the gRPC listener, and each ChatLink's (wss:// and TLS TCP). The
	// files are re-read when they change (certfiles). Zero value means plaintext.
	TLS certfiles.Config
	// CORSOrigins are the origins whose pages may call GET /v1/dispatch and GET /v1/dev/token
	// from another origin (roles.ServicesConfig.CORSOrigins: "*", "self" or origins). Zero
	// value means none; `roomcast dev` passes "self".
	CORSOrigins []string
	// Home serves GET / (the demo page) and GET /demo.js (its script). Zero value means 404.
	Home http.Handler
	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the HTTP endpoint. It is
	// for finding where time goes on a dev machine: never set it where others can reach
	// the endpoint. Zero value means no profiles. Block and mutex profiles are empty unless
	// the process sets runtime.SetBlockProfileRate and runtime.SetMutexProfileFraction.
	Pprof bool
	// NoPusher runs no CDN pusher in the services: a test starts its own against S3. Zero value
	// means one pusher, writing to the embedded store with CDN.Window.
	NoPusher bool
	// Log receives every component's logs. Zero value means none.
	Log *slog.Logger
	// Audit receives the audit trail of the server API and the ChatLinks. Zero value means
	// Log.
	Audit *slog.Logger

	// ChatLink configures every ChatLink; the cluster sets its Node, Log, Audit and
	// ReportInterval, zero Keys to the dev app's ({App: Secret}), and a zero MaxConnections
	// to a share of the process's open files.
	ChatLink chatlink.Config
	// PerNode, when set, adjusts each ChatLink's configuration, its Node set, before it
	// starts: what differs between the nodes (`roomcast dev --node-label`).
	PerNode func(*chatlink.Config)
	// Room configures the room service's instances; the cluster sets a zero LeaseTTL. Its zero
	// RequireCreated opens rooms implicitly, as the demo page needs.
	Room room.Config
	// Presence configures the presence instances; the cluster sets a zero LeaseTTL.
	Presence presence.Config
	// Queue configures the room queue instances.
	Queue roomqueue.Config
	// Dispatcher configures the dispatcher. Zero CityDB and ISPDB mean clients are dispatched
	// on load alone; with either, SIGHUP reloads them.
	Dispatcher dispatcher.Config
	// API configures the server API. Zero Keys mean {APIKey: App}.
	API api.Config
	// CDN configures the CDN manager. Its BaseURLs default to the HTTP endpoint's /cdn, the
	// embedded store's origin.
	CDN cdnmanager.Config
	// Callbacks are the apps' login and send callbacks (roles.ServicesConfig.Callbacks). Zero
	// value means none.
	Callbacks callback.Config
}

func (c Config) withDefaults() (Config, error) {
	if c.DataDir == "" {
		return c, errors.New("devcluster: Config.DataDir is required")
	}
	if c.ChatLinks <= 0 {
		c.ChatLinks = 2
	}
	if c.LeaseInterval <= 0 {
		c.LeaseInterval = time.Second
	}
	if c.API.Keys == nil {
		c.API.Keys = auth.APIKeys{APIKey: {App: App}}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Cluster is a running dev deployment: an embedded NATS server, the services role (its room
// and presence instances, dispatcher and server API are promoted from roles.Services) and the
// ChatLinks.
type Cluster struct {
	*roles.Services
	// NATS is the embedded NATS server; nil with Config.NATSURL.
	NATS  *server.Server
	Nodes []*chatlink.Node
	// S3 is the embedded object store the CDN pushers write to.
	S3 *devs3.Server

	log       *slog.Logger
	natsURL   string   // the services' NATS
	dataLock  *os.File // holds DataDir's lock (lockDataDir) until Close
	chatlinks []*roles.ChatLink
	closed    bool

	servicesCfg roles.ServicesConfig // what RestartServices starts again
}

// Start brings a cluster up and returns once every ChatLink is known to the dispatcher.
// On error, whatever had started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Log
	c := &Cluster{log: log}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()

	if cfg.NATSPort != 0 && cfg.NATSURL == "" {
		// The embedded server would only log that it cannot listen, and never become ready.
		if err = checkFree("NATS", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.NATSPort))); err != nil {
			return nil, err
		}
	}
	if c.dataLock, err = lockDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	var inProcess []nats.Option
	c.natsURL = cfg.NATSURL
	if c.natsURL == "" {
		natsStarted := time.Now()
		if c.NATS, err = devnats.Start(devnats.Config{Port: cfg.NATSPort, StoreDir: filepath.Join(cfg.DataDir, "nats")}); err != nil {
			return nil, err
		}
		c.natsURL = c.NATS.ClientURL()
		// In the server's own process: a pipe instead of a loopback TCP connection, so what a dev
		// deployment spends on its bus is not the kernel's loopback round trips.
		inProcess = []nats.Option{nats.InProcessServer(c.NATS)}
		if err = releaseStaleNames(ctx, c.NATS, cfg.ChatLinks, natsStarted); err != nil {
			return nil, err
		}
	}
	if c.S3, err = devs3.Start(devs3.Config{Log: log}); err != nil {
		return nil, err
	}
	var pusher *cdnpusher.ServiceConfig
	if !cfg.NoPusher {
		pusher = &cdnpusher.ServiceConfig{Pusher: c.PusherStorage()}
		pusher.Pusher.Window = cfg.CDN.Window
	}
	leaseTTL := 3 * cfg.LeaseInterval
	if cfg.Room.LeaseTTL <= 0 {
		cfg.Room.LeaseTTL = leaseTTL
	}
	if cfg.Presence.LeaseTTL <= 0 {
		cfg.Presence.LeaseTTL = leaseTTL
	}
	c.servicesCfg = roles.ServicesConfig{
		NATSURL: c.natsURL, NATSOptions: inProcess,
		Listen: cfg.Listen, GRPCListen: cfg.GRPCListen,
		Instances:  cfg.ServiceInstances,
		Room:       cfg.Room,
		Presence:   cfg.Presence,
		Queue:      cfg.Queue,
		Dispatcher: cfg.Dispatcher,
		API:        cfg.API,
		Pprof:      cfg.Pprof,
		Callbacks:  cfg.Callbacks,
		// One local endpoint for everything: the banner shows its /metrics and /v1/nodes.
		PublicAdmin: true,
		CDN:         cfg.CDN,
		Pusher:      pusher,
		CDNOrigin:   c.S3.Origin(),
		Routes: func(mux *http.ServeMux) {
			mux.HandleFunc("GET "+devTokenPath, devToken)
			if cfg.Home != nil {
				mux.Handle("GET /{$}", cfg.Home)
				mux.Handle("GET /demo.js", cfg.Home)
			}
		},
		Log: log, Audit: cfg.Audit,
		TLS: cfg.TLS, CORSOrigins: cfg.CORSOrigins, CORSPaths: []string{devTokenPath},
	}
	c.Services, err = roles.StartServices(c.servicesCfg)
	if err != nil {
		return nil, err
	}

	keys := auth.Keyring{App: []byte(Secret)}
	for i := 1; i <= cfg.ChatLinks; i++ {
		ncfg := cfg.ChatLink
		ncfg.Node, ncfg.Log, ncfg.Audit = nodeName(i), log, cfg.Audit
		if ncfg.Keys == nil {
			ncfg.Keys = keys
		}
		ncfg.ReportInterval = cfg.LeaseInterval
		if ncfg.MaxConnections == 0 {
			// The nodes share this process's open files.
			ncfg.MaxConnections = max(1000, (chatlink.FileLimit()-1024)/cfg.ChatLinks)
		}
		if cfg.PerNode != nil {
			cfg.PerNode(&ncfg)
		}
		natsURL, natsOptions := c.natsURL, inProcess
		if cfg.NodeNATSURL != nil {
			natsURL, natsOptions = cfg.NodeNATSURL(i), nil
		}
		cl, err := roles.StartChatLink(roles.ChatLinkConfig{
			NATSURL: natsURL, NATSOptions: natsOptions, Node: ncfg, Registry: c.Registry, TLS: cfg.TLS,
		})
		if err != nil {
			return nil, err
		}
		c.chatlinks = append(c.chatlinks, cl)
		c.Nodes = append(c.Nodes, cl.Node)
	}

	for c.Dispatcher.LiveNodes() < len(c.Nodes) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("devcluster: waiting for ChatLinks to report: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return c, nil
}

// RestartServices stops the services role and starts it again on the same NATS server and
// JetStream store, and on the same HTTP and gRPC addresses, as a deploy of the services would;
// it returns once the new dispatcher knows every ChatLink again. The new role has a metrics
// registry of its own: the ChatLinks' metrics stay on the old one.
func (c *Cluster) RestartServices(ctx context.Context) error {
	cfg := c.servicesCfg
	cfg.Listen, cfg.GRPCListen = c.httpAddr(), c.GRPCAddr()
	c.Services.Close()
	s, err := roles.StartServices(cfg)
	if err != nil {
		return fmt.Errorf("devcluster: restart the services: %w", err)
	}
	c.Services = s
	for c.Dispatcher.LiveNodes() < len(c.Nodes) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("devcluster: waiting for ChatLinks to report after the restart: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// httpAddr is the HTTP endpoint's host:port.
func (c *Cluster) httpAddr() string {
	u := c.URL()
	return u[strings.Index(u, "://")+3:]
}

// checkFree returns a roles.ListenError unless addr can be listened on now.
func checkFree(what, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &roles.ListenError{Listener: what, Addr: addr, Err: err}
	}
	return ln.Close()
}

// nodeName is the name of the dev cluster's ChatLink i (from 1).
func nodeName(i int) string { return "cl-" + strconv.Itoa(i) }

// releaseStaleNames deletes the name leases (chatlink.NodesBucket) of the cluster's ChatLinks
// that were last renewed before its NATS server started: they are a previous run's, killed
// before it could release them, whose JetStream data the server has just read back (no
// running cluster shares the data directory: lockDataDir). Without this a restart within the
// lease's TTL of a kill -9 would fail. A lease renewed since the start belongs to a ChatLink of
// another process that is live on this server, and is left alone: starting over it fails with
// chatlink.ErrNameHeld.
func releaseStaleNames(ctx context.Context, ns *server.Server, chatLinks int, started time.Time) error {
	nc, err := nats.Connect(ns.ClientURL(), nats.InProcessServer(ns), nats.Name("devcluster"))
	if err != nil {
		return fmt.Errorf("devcluster: connect to the embedded NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("devcluster: jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, chatlink.NodesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("devcluster: node lease bucket: %w", err)
	}
	for i := 1; i <= chatLinks; i++ {
		e, err := kv.Get(ctx, nodeName(i))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("devcluster: node lease of %s: %w", nodeName(i), err)
		}
		if !e.Created().Before(started) {
			continue
		}
		// LastRevision: should the node renew it meanwhile, it is live, and the delete fails.
		if err := kv.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision())); err != nil {
			return fmt.Errorf("devcluster: release the previous run's lease of %s: %w", e.Key(), err)
		}
	}
	return nil
}

// PusherStorage returns a pusher config with the embedded store's endpoint and bucket, for a
// pusher of this cluster.
func (c *Cluster) PusherStorage() cdnpusher.Config {
	return cdnpusher.Config{Endpoint: c.S3.Endpoint(), Bucket: c.S3.Bucket(), AccessKey: "dev", SecretKey: "dev-secret"}
}

// CDNOrigin returns the base URL under which the HTTP endpoint serves the segments.
func (c *Cluster) CDNOrigin() string { return c.URL() + "/cdn" }

// NATSURL returns the URL of the NATS the services connect to: the embedded server's, or
// Config.NATSURL.
func (c *Cluster) NATSURL() string { return c.natsURL }

// Mint returns a login token for uid in room of the dev app, with opts' claims (a lane the
// member may send on: auth.WithLanes).
func (c *Cluster) Mint(uid, room string, tags []string, ttl time.Duration, opts ...auth.MintOption) (string, error) {
	return auth.Mint([]byte(Secret), App, uid, room, tags, ttl, opts...)
}

// Close stops everything, ChatLinks first (their clients are closed with SHUTDOWN, a
// transient code: reconnect elsewhere). It may be called more than once.
func (c *Cluster) Close() {
	if c.closed {
		return
	}
	c.closed = true
	for _, cl := range c.chatlinks {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := cl.Shutdown(ctx); err != nil {
			c.log.Warn("chatlink shutdown", "node", cl.Node.Name(), "err", err)
		}
		cancel()
	}
	if c.Services != nil {
		c.Services.Close()
	}
	if c.NATS != nil {
		c.NATS.Shutdown()
		c.NATS.WaitForShutdown()
	}
	if c.S3 != nil {
		c.S3.Close()
	}
	if c.dataLock != nil {
		_ = c.dataLock.Close() // releases the lock
	}
}

// ErrDataDirInUse is returned by Start when another running cluster uses Config.DataDir.
var ErrDataDirInUse = errors.New("data directory in use")

// lockDataDir takes dataDir's lock, which the returned file holds until it is closed or the
// process ends, however it ends. Two NATS servers must not share a JetStream store; and with
// the lock held, every name lease found in the store is a dead process's (releaseStaleNames).
func lockDataDir(dataDir string) (*os.File, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	name := filepath.Join(dataDir, "roomcast-dev.lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	if err := osdep.LockFile(f); err != nil {
		_ = f.Close()
		if errors.Is(err, osdep.ErrLocked) {
			return nil, fmt.Errorf("devcluster: %w: another roomcast dev runs on %s", ErrDataDirInUse, dataDir)
		}
		return nil, fmt.Errorf("devcluster: lock %s: %w", name, err)
	}
	return f, nil
}

// devTokenPath is the path of devToken.
const devTokenPath = "/v1/dev/token"

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
