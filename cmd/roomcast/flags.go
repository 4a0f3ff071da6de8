package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"roomcast/api"
	"roomcast/callback"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/certfiles"
	"roomcast/presence"
	"roomcast/room"
	"roomcast/roomqueue"
	"roomcast/store/historystore"
	"roomcast/store/inbox"
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

// apiKeys is the repeatable --api-key flag: KEY=APP (every scope) or KEY=APP:SCOPE,SCOPE.
type apiKeys auth.APIKeys

func (k apiKeys) String() string {
	m := make(map[string]string, len(k))
	for key, g := range k {
		m[key] = g.App
		if len(g.Scopes) > 0 {
			m[key] += ":" + strings.Join(g.Scopes, ",")
		}
	}
	return fmt.Sprint(m)
}

func (k apiKeys) Set(s string) error {
	key, grant, err := auth.ParseAPIKey(s)
	if err != nil {
		return err
	}
	if err := api.CheckScopes(grant.Scopes); err != nil {
		return err
	}
	k[key] = grant
	return nil
}

// parseFlags parses args, printing usage on --help, then sets the flags args left unset from
// the environment and the config file (config.go); it returns the exit code to use when the
// caller should stop (0 after --help or --check-config, 2 after a bad flag or configuration)
// and -1 to go on.
func parseFlags(fs *flag.FlagSet, args []string) int {
	path, check := bindConfigFlags(fs)
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
	if *path == "" {
		*path = os.Getenv(envName("config"))
	}
	if err := applyConfig(fs, *path, os.LookupEnv); err != nil {
		fmt.Fprintf(fs.Output(), "roomcast %s: %s\n", fs.Name(), oneLine(err.Error()))
		return 2
	}
	if parsedHook != nil {
		parsedHook(fs)
	}
	if *check {
		return 0
	}
	return -1
}

// parsedHook, when set (by tests, never concurrently with a command), sees each command's flags
// once they are parsed and configured.
var parsedHook func(*flag.FlagSet)

// bindNATSFlag binds --nats, the NATS server of the commands that connect to one.
func bindNATSFlag(fs *flag.FlagSet, url *string) {
	fs.StringVar(url, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
}

// bindServicesFlags binds the flags of the services role that `roomcast services` and
// `roomcast dev` share: its two endpoints and the dispatcher's GeoIP databases.
func bindServicesFlags(fs *flag.FlagSet, listen, grpcListen, cityDB, ispDB *string) {
	fs.StringVar(listen, "listen", "127.0.0.1:8080", "address of the public HTTP endpoint: dispatch, the server API, /healthz (in dev also /metrics, /v1/nodes and the demo page)")
	fs.StringVar(grpcListen, "grpc-listen", "127.0.0.1:9090", "address of the gRPC listener: the server API and the dispatcher")
	fs.StringVar(cityDB, "geoip-city", "", "GeoIP2/GeoLite2 City or Country database for the dispatcher (empty: dispatch on load alone)")
	fs.StringVar(ispDB, "geoip-isp", "", "GeoIP2 ISP or GeoLite2 ASN database for the dispatcher")
}

// bindRoomShareFlag binds the dispatcher's room affinity (dispatcher.Config.RoomShare).
func bindRoomShareFlag(fs *flag.FlagSet, share *float64) {
	fs.Float64Var(share, "room-share", dispatcher.DefaultRoomShare, "the dispatcher's room affinity: the share of a ChatLink's capacity one room fills before its next members open another node (negative: no room affinity, dispatch on locality and load alone)")
}

// nearRegions is the repeatable --near-region flag: REGION=REGION,REGION,... (the dispatcher's
// Config.NearRegions); the dispatcher checks the regions.
type nearRegions map[string][]string

func (n nearRegions) String() string {
	out := make([]string, 0, len(n))
	for k, v := range n {
		out = append(out, k+"="+strings.Join(v, ","))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func (n nearRegions) Set(s string) error {
	from, list, ok := strings.Cut(s, "=")
	if !ok || from == "" || list == "" {
		return fmt.Errorf("want REGION=REGION,REGION,..., e.g. AS=NA,EU; got %q", s)
	}
	if _, dup := n[from]; dup {
		return fmt.Errorf("%s is given twice", from)
	}
	n[from] = strings.Split(list, ",")
	return nil
}

func (nearRegions) repeatable() {}

// bindNearRegionFlag binds the dispatcher's near-region table (dispatcher.Config.NearRegions).
func bindNearRegionFlag(fs *flag.FlagSet, table *map[string][]string) {
	n := nearRegions{}
	*table = n
	fs.Var(n, "near-region", "REGION=REGION,REGION,...: for the dispatcher, the regions of other continents a client of REGION is sent to, nearest first, when its own continent's ChatLinks are drained, out or full, e.g. AS=NA,EU (region labels as --region's; repeatable; default: other continents are equally far)")
}

// poolReservations is the repeatable --reserve-pool flag: POOL=APP or POOL=APP/ROOM.
type poolReservations []dispatcher.PoolReservation

func (p *poolReservations) String() string {
	out := make([]string, 0, len(*p))
	for _, r := range *p {
		out = append(out, r.String())
	}
	return strings.Join(out, " ")
}

func (p *poolReservations) Set(s string) error {
	r, err := dispatcher.ParsePoolReservation(s)
	if err != nil {
		return err
	}
	*p = append(*p, r)
	return nil
}

func (*poolReservations) repeatable() {}

// bindReservePoolFlag binds --reserve-pool, the dispatcher's pool reservations
// (dispatcher.Config.Pools), read again by a reload.
func bindReservePoolFlag(fs *flag.FlagSet) *poolReservations {
	p := &poolReservations{}
	fs.Var(p, "reserve-pool", "POOL=APP or POOL=APP/ROOM: the dispatcher sends the app's (or room's) clients only to the ChatLinks labelled --pool POOL, and nobody else's to them; with none of them live it refuses those clients (repeatable; read again on SIGHUP and when its file changes; default: none)")
	return p
}

// bindQueueFlags binds the room queue service's limits (roomqueue.Config).
func bindQueueFlags(fs *flag.FlagSet, cfg *roomqueue.Config) {
	fs.IntVar(&cfg.MaxEntries, "queue-max-entries", roomqueue.DefaultMaxEntries, fmt.Sprintf("the most entries a room's queue holds (a room's queue_max_entries may set fewer; at most %d)", roomqueue.LimitEntries))
	fs.IntVar(&cfg.MaxValueBytes, "queue-max-value", roomqueue.DefaultMaxValueBytes, fmt.Sprintf("the most bytes of a room queue entry's value (at most %d)", roomqueue.LimitValueBytes))
}

// bindRoomFlags binds the room service's settings that `roomcast services` and `roomcast dev`
// share (room.Config's history retention, batch window and caps), their defaults the room
// service's: the deployment's, which a room's settings may lower.
func bindRoomFlags(fs *flag.FlagSet, c *room.Config) {
	fs.IntVar(&c.HistoryPerRoom, "history-per-room", historystore.PerRoom, "how many critical and normal messages each room keeps (for --history-max-age at most) for the history API and for clients to recover after a reconnect; a room's settings may keep fewer")
	fs.DurationVar(&c.HistoryMaxAge, "history-max-age", room.DefaultHistoryMaxAge, "how long each room's history keeps a message; a room's settings may keep them for less")
	fs.DurationVar(&c.BatchWindow, "room-batch-window", room.DefaultBatchWindow, "how long the room service gathers a room's messages before it sends them to the room's nodes as one batch: adds up to this much latency, and keeps the bus at one message per room, node and window (negative: each request at once)")
	fs.IntVar(&c.BulkPerSecond, "room-bulk-per-second", room.DefaultBulkPerSecond, "bulk messages a room passes to the bus per second when its settings set no bulk_per_second; past it they are sampled out and counted (negative: no cap)")
	fs.IntVar(&c.MemberSendsPerSecond, "room-member-sends-per-second", room.DefaultMemberSendsPerSecond, "messages a room's members may send per second, all of them together, on every lane, in bursts of twice that, per room service instance; over it a send is refused with Error 120 and a retry hint (the app server's sends are not counted; negative: no cap)")
	fs.IntVar(&c.MemberCriticalPerSecond, "room-member-critical-per-second", room.DefaultMemberCriticalPerSecond, "critical messages a room's members may send per second, all of them together, in bursts of twice that, per room service instance, when the room's settings set no member_critical_per_second; over it a send is refused with Error 120 and a retry hint (negative: no cap)")
}

// bindInboxFlags binds the server API's settings of the at-least-once messages to users
// (api.InboxConfig).
func bindInboxFlags(fs *flag.FlagSet, cfg *api.InboxConfig) {
	fs.DurationVar(&cfg.Expiry, "inbox-expiry", inbox.DefaultExpiry, "how long an at-least-once message to a user stays stored unacknowledged when the send does not say (expiry_seconds)")
	fs.DurationVar(&cfg.MaxExpiry, "inbox-max-expiry", inbox.DefaultMaxExpiry, "the longest expiry an at-least-once send may ask for; longer ones are refused (400)")
	fs.IntVar(&cfg.MaxPerUser, "inbox-max-per-user", inbox.DefaultMaxPerUser, "how many at-least-once messages a user may have stored; sends to a user with that many fail for that user (INBOX_FULL)")
}

// bindChatLinkFlags binds the ChatLink flags that `roomcast chatlink` and `roomcast dev` share
// to c, their defaults chatlink.DefaultConfig's; call the returned function after parsing.
func bindChatLinkFlags(fs *flag.FlagSet, c *chatlink.Config) func() {
	d := chatlink.DefaultConfig()
	fs.Float64Var(&c.EgressCapacity, "egress-capacity", d.EgressCapacity, "a ChatLink's egress capacity in bytes per second (in dev: each one's), the base of flow control (0: unlimited)")
	fs.DurationVar(&c.FlushTick, "flush-tick", d.FlushTick, "how long a room's messages gather before they go out as one frame, for rooms without their own setting")
	fs.DurationVar(&c.LatencyBudget, "latency-budget", d.LatencyBudget, "how long a normal or bulk message may wait so that a quiet room's frames carry several messages (less CPU per delivery, more latency), for rooms without their own latency_budget_ms: a member's frame goes at a tick once --gather-messages wait, a critical one waits, or another tick would pass this (0: off, every tick's messages go at that tick)")
	fs.IntVar(&c.GatherMessages, "gather-messages", d.GatherMessages, "waiting messages that make a frame go at the next tick despite the latency budget, for rooms without their own gather_messages")
	fs.IntVar(&c.PhaseMembers, "phase-members", d.PhaseMembers, "members of a room per flush phase on a ChatLink: a bigger room's flushes are spread over the tick in up to 16 phases")
	fs.BoolVar(&c.PlainWrites, "plain-writes", d.PlainWrites, "keep the writers from before io_uring batch sends: gws for WebSocket, a system call per frame (for comparison; also what a node without io_uring does)")
	fs.BoolVar(&c.ReaderGoroutines, "reader-goroutines", d.ReaderGoroutines, "give every WebSocket connection a reader goroutine instead of reading from the ChatLink's epoll poller (for comparison; more memory per idle connection)")
	fs.DurationVar(&c.OrderHold, "order-hold", d.OrderHold, "how long a ChatLink holds a room's numbered messages that arrive ahead of a missing room_seq before it reads the missing ones from the room's history (within --order-fill-timeout), then gives up on what is still missing, counted and logged (negative: deliver in arrival order)")
	fs.DurationVar(&c.OrderFillTimeout, "order-fill-timeout", d.OrderFillTimeout, "how long the history read for a room's missing numbered messages may take before they are given up (a ChatLink in a region far from the history needs a wide-area round trip)")
	return bindClientLimitFlags(fs, c)
}

// bindTLSFlags binds --tls-cert and --tls-key, the certificate files of the commands that
// serve TLS, and the session-ticket flags.
func bindTLSFlags(fs *flag.FlagSet, files *certfiles.Config, what string) {
	fs.StringVar(&files.CertFile, "tls-cert", "", "PEM certificate chain file: serve "+what+" over TLS; re-read when it changes (checked at a handshake, at most every 2s)")
	fs.StringVar(&files.KeyFile, "tls-key", "", "PEM private key file of --tls-cert")
	fs.StringVar(&files.TicketSecretFile, "tls-ticket-secret", "", "file of at least 32 secret bytes, the same on every server of the deployment, from which TLS session-ticket keys are derived: a client resumes its session on any of them (default: keys random to this process)")
	fs.DurationVar(&files.TicketRotate, "tls-ticket-rotate", certfiles.DefaultTicketRotate, "how long one session-ticket key seals new tickets; tickets of the key before still resume")
}

// bindCORSFlag binds --cors-origins: after parsing, the returned function lists them.
func bindCORSFlag(fs *flag.FlagSet, def string) func() []string {
	origins := fs.String("cors-origins", def, "comma-separated web origins (https://app.example.com) whose pages may call GET /v1/dispatch (and dev's /v1/dev/token) from another origin; * for any, self for this endpoint's own (empty: none)")
	return func() []string {
		var out []string
		for o := range strings.SplitSeq(*origins, ",") {
			if o = strings.TrimSpace(o); o != "" {
				out = append(out, o)
			}
		}
		return out
	}
}

// bindPresenceFlags binds the presence service's per-app settings that `roomcast services`
// and `roomcast dev` share; after parsing, the returned function checks them and sets them in
// the config.
func bindPresenceFlags(fs *flag.FlagSet) func(*presence.Config) error {
	webhooks, policies := pairs{}, pairs{}
	var every time.Duration
	fs.Var(webhooks, "presence-webhook", "APP=URL: where the app's online/offline events are POSTed, batched as JSON (repeatable; docs/api.md)")
	fs.DurationVar(&every, "presence-webhook-every", presence.DefaultWebhookEvery, "how often the batched presence events are posted")
	fs.Var(policies, "device-policy", "APP=RULES: the app's rule for users with several sessions, RULES a comma-separated list of max-sessions=N and one-per-device; a login that breaks it closes the user's older sessions with 4010 REPLACED (repeatable; default: no limits)")
	return func(c *presence.Config) error {
		c.WebhookEvery = every
		if len(webhooks) > 0 {
			c.Webhooks = webhooks
		}
		for app, rules := range policies {
			if c.Policies == nil {
				c.Policies = map[string]presence.DevicePolicy{}
			}
			var p presence.DevicePolicy
			for rule := range strings.SplitSeq(rules, ",") {
				name, val, _ := strings.Cut(strings.TrimSpace(rule), "=")
				switch n, err := strconv.Atoi(val); {
				case name == "one-per-device" && val == "":
					p.OnePerDevice = true
				case name == "max-sessions" && err == nil && n > 0:
					p.MaxSessions = n
				default:
					return fmt.Errorf("--device-policy %s=%s: %q is not max-sessions=N (N > 0) or one-per-device", app, rules, rule)
				}
			}
			c.Policies[app] = p
		}
		return nil
	}
}

// bindTrustedProxyFlag binds --trusted-proxy, the proxies whose forwarding headers the
// dispatcher believes.
func bindTrustedProxyFlag(fs *flag.FlagSet, proxies *[]string) {
	fs.Var((*urls)(proxies), "trusted-proxy", "address or CIDR of a proxy in front of --listen and --grpc-listen whose X-Forwarded-For / X-Real-IP name the client the dispatcher places (repeatable; default: none, the client is the connection's peer)")
}

// bindKVReplicasFlag binds --kv-replicas, the copies of the JetStream KV buckets and streams a
// role creates.
func bindKVReplicasFlag(fs *flag.FlagSet, replicas *int) {
	fs.IntVar(replicas, "kv-replicas", 0, "copies of the JetStream KV buckets and streams this role creates or updates at start: 3 on a 3-node NATS cluster, at most the cluster's size; give every process the same (0: 1)")
}

// bindCallbacksFlag binds --callbacks, the file of the apps' login and send callbacks
// (docs/callbacks.md); after parsing, the returned function loads it (nil without the flag).
func bindCallbacksFlag(fs *flag.FlagSet) func() (map[string]callback.AppConfig, error) {
	path := fs.String("callbacks", "", "JSON file of the apps' login and send callbacks: URLs, secret_file or secret_env, timeout, concurrency, breaker, fail-open or fail-closed (docs/callbacks.md; empty: none; services read it again on SIGHUP and when it changes)")
	return func() (map[string]callback.AppConfig, error) {
		if *path == "" {
			return nil, nil
		}
		return callback.LoadFile(*path)
	}
}
