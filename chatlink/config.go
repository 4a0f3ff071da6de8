package chatlink

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/auth"
	"roomcast/internal/osdep"
)

// The thresholds of node flow control when Config leaves them zero, as shares of the egress
// capacity (docs/edge.md).
const (
	DefaultFlowT1 = 0.70
	DefaultFlowT2 = 0.85
)

// Config configures a ChatLink node. New applies the defaults (withDefaults); the node keeps
// the result.
type Config struct {
	// Node names this node; it prefixes every session id, so it must be unique in the
	// deployment and a valid name (auth.ValidName). Required.
	Node string
	// Bus is the NATS connection. Required.
	Bus *nats.Conn
	// Keys verify login tokens, by app. Required. Node.SetKeys replaces them while it runs.
	Keys auth.Keyring
	// MaxTokenLifetime bounds, per app, how far ahead of now a login token's exp may be; a
	// token that would stay valid longer is refused (4001 BAD_TOKEN). Its apps must be in
	// Keys. An app not in it, and the zero value, mean 24h (auth.DefaultMaxLifetime).
	MaxTokenLifetime auth.Lifetimes
	// WSListen is the address of the WebSocket listener (path /v1/ws). Zero value means
	// 127.0.0.1:0, a free port.
	WSListen string
	// TCPListen is the address of the length-prefixed TCP listener. Zero value means
	// 127.0.0.1:0, a free port.
	TCPListen string
	// PublicHost is the host clients reach this node at, put in the load reports the
	// dispatcher hands out. Zero value means the host of the listeners.
	PublicHost string
	// TLS, when set, makes both listeners TLS: the WebSocket one serves wss:// and the TCP
	// one TLS, every handshake bounded by 5s. TLS connections are read by the poller and
	// written by the node's writer as plain ones are (transport_tls.go); the certificate and
	// the session tickets' keys come from the config (internal/certfiles re-reads changed
	// certificate files at a handshake). Zero value means plaintext: ws:// and plain TCP.
	TLS *tls.Config
	// PublicWSURL is the WebSocket URL the node advertises instead of its listener's, for a
	// node behind a proxy (often one that terminates TLS: wss://chat.example.com/v1/ws). Zero
	// value means the listener's URL: ws://, or wss:// with TLS, at PublicHost or the
	// listener's host, its port, path /v1/ws.
	PublicWSURL string
	// PublicTCPAddr is the host:port the node advertises for its TCP transport instead of its
	// listener's. Zero value means the listener's port at PublicHost or the listener's host.
	PublicTCPAddr string
	// PublicTCPTLS advertises the TCP transport as TLS although the node serves it plain: a
	// proxy at PublicTCPAddr terminates TLS. With TLS set the transport is advertised as TLS
	// anyway. Zero value (false) means as the node serves it.
	PublicTCPTLS bool
	// Region and ISP label this node for the dispatcher. Zero values mean unlabelled.
	Region, ISP string
	// Pool puts the node in an event pool: while the dispatcher reserves the pool for an app or
	// a room, it sends only that app's or room's clients here (docs/dispatch.md, "Event
	// pools"). The node itself serves any valid login. Zero value means none.
	Pool string
	// MaxFrameBytes limits a client frame. Zero value means 65536.
	MaxFrameBytes int
	// ReaderGoroutines gives every WebSocket connection a reader goroutine of its own, as
	// gws's ReadLoop does, instead of reading from the node's poller when a socket is
	// readable. The poller (Linux only; elsewhere this is always true) saves the 2 KiB stack
	// and runtime bookkeeping of a parked goroutine per idle connection. It applies to TCP
	// connections alike. Zero value (false) means the poller reads, where there is one.
	ReaderGoroutines bool
	// PlainWrites keeps the writers the node had before its io_uring batch sends: gws's
	// asynchronous writer for WebSocket, a queue and a flush goroutine for TCP, a write(2) per
	// frame. Without it, on Linux 5.6 and later, the node writes the sockets its poller reads
	// itself, sending a room's frames in batches through io_uring (batch.go); where io_uring
	// is missing or forbidden (some container seccomp profiles) the node logs so and writes
	// as with PlainWrites. ReaderGoroutines implies plain writes. Zero value (false) means
	// io_uring batch sends where the kernel allows them.
	PlainWrites bool
	// LoginTimeout is how long a new connection may take to log in. Zero value means 10s.
	LoginTimeout time.Duration
	// HeartbeatInterval is the interval first announced to clients; a connection silent for
	// three of its intervals is closed. Zero value means 25s.
	HeartbeatInterval time.Duration
	// HeartbeatMax caps the interval: while a client beats on time, every third beat raises its
	// interval by HeartbeatStep up to HeartbeatMax; a late beat drops it back to
	// HeartbeatInterval. Zero values mean 2.4x and 0.2x HeartbeatInterval (60s and 5s).
	HeartbeatMax, HeartbeatStep time.Duration
	// FlushTick is how long a room's messages gather before they go out as one frame, for rooms
	// whose settings name none. Zero value means 100ms.
	FlushTick time.Duration
	// OrderHold is how long a room's numbered messages that arrive ahead of a missing room_seq
	// wait for it before the node reads the missing ones from the room's history; the read
	// gets OrderFillTimeout, then what is still missing is given up (counted in
	// roomcast_chatlink_order_total{event="skipped"} and logged) and the held messages go out
	// (order.go). Zero value means 100ms; negative delivers in arrival order.
	OrderHold time.Duration
	// OrderFillTimeout bounds the history read for a gap: the round trip to the room's history
	// (JetStream) and the read. A node in a region far from the history needs more than one
	// round trip of the wide-area link. Zero value means 1s.
	OrderFillTimeout time.Duration
	// LatencyBudget is how long a normal or bulk message may wait for the next ones to share
	// its frame, for rooms whose settings name none (latency_budget_ms): a quiet room's member
	// gets a frame once GatherMessages messages wait for it, a critical one waits, or waiting
	// another tick would pass the budget (fanout.go). Zero value means off: every tick's
	// messages go at that tick.
	LatencyBudget time.Duration
	// GatherMessages is how many waiting messages make a frame go at the next tick despite the
	// latency budget, for rooms whose settings name none (gather_messages). Zero value means 4.
	GatherMessages int
	// PhaseMembers is how many of a room's members on this node share one flush phase: a room
	// with more is split into phase groups (a power of two, at most 16, each phase at least
	// 10ms apart) flushed one after another through the tick, so its socket writes are spread
	// over the tick instead of coming in one burst (fanout.go). Zero value means 1024.
	PhaseMembers int
	// EgressCapacity is the node's egress bandwidth in bytes per second, the base of node flow
	// control. Zero value means unlimited: no flow control.
	EgressCapacity float64
	// FlowT1 and FlowT2 are the two thresholds of node flow control, as shares of
	// EgressCapacity. Zero values mean DefaultFlowT1 and DefaultFlowT2.
	FlowT1, FlowT2 float64
	// ThinAtPendingBytes, CriticalOnlyAtPendingBytes and MaxPendingBytes set how a connection's
	// write backlog (bytes queued, not yet taken by its socket) changes what it gets: from the
	// first it gets no bulk, from the second only critical, and past the third it is closed as
	// a slow reader. Zero values mean 64 KiB, 256 KiB and 1 MiB.
	ThinAtPendingBytes, CriticalOnlyAtPendingBytes, MaxPendingBytes int
	// RequestTimeout bounds each request to a service (join, send). Zero value means 3s.
	RequestTimeout time.Duration
	// MaxInflightSends bounds the sends one connection may have waiting for the room service;
	// more are refused with RATE_LIMITED. Zero value means 32.
	MaxInflightSends int
	// SendWindow is how long a room's members' sends gather on the node before they go to the
	// room service as one request (upload.go): at most one request per room and window, one in
	// flight at a time. Zero value means DefaultSendWindow (20ms); a negative one forwards
	// each send as its own request.
	SendWindow time.Duration
	// CounterWindow is how long the node sums a room's counter adds before it sends them to the
	// room service, one message per room and window (counters.go). Zero value means
	// DefaultCounterWindow (200ms).
	CounterWindow time.Duration
	// CounterMaxAmount is the largest amount one CounterAdd may add; a larger one is refused
	// with 100 (BAD_REQUEST). Zero value means DefaultCounterMaxAmount (100).
	CounterMaxAmount int
	// ViewerInterval is how often the node sends its members per room to the room service and
	// writes each room's viewer count to its members when it changed (viewers.go). Zero value
	// means DefaultViewerInterval (3s).
	ViewerInterval time.Duration
	// KVReplicas is the replication of the KV bucket of the nodes' name leases (NodesBucket),
	// which the node creates or updates at start. Zero value means 1.
	KVReplicas int
	// MaxConnections is how many client connections the node takes: it reports the number to
	// the dispatcher and refuses logins beyond it (4504 UNAVAILABLE: dispatch again). Zero
	// value means the process's open-file limit less 256 for everything else.
	MaxConnections int
	// Limits are the rates and counts clients are held to (limits.go). A zero field means
	// DefaultLimits'; ratelimit.Unlimited (a negative count) turns one off.
	Limits Limits
	// TrustedProxies are the addresses and CIDRs of proxies in front of the node whose
	// X-Forwarded-For and X-Real-IP headers (WebSocket upgrade, HTTP fallback) name the client
	// the limits and address lists apply to. Zero value means none: the peer is the client.
	TrustedProxies []string
	// IPListFile names a file of "allow CIDR" and "deny CIDR" lines, read again within a second
	// when it changes and when the process gets SIGHUP (limits.go); a file that does not parse
	// keeps the lists in force. Zero value means every address is allowed.
	IPListFile string
	// ExprCacheSize bounds the compiled tag expressions kept. Zero value means 1024.
	ExprCacheSize int
	// DrainSpread is how widely the reconnect delays told to clients are spread when the node
	// drains, so they do not all come back at once. Zero value means 10s.
	DrainSpread time.Duration
	// ReportInterval is how often a load report is published. Zero value means 1s.
	ReportInterval time.Duration
	// Registry receives the node's metrics, labelled node=<Node>. Zero value means none are
	// registered.
	Registry prometheus.Registerer
	// Log receives the node's logs. Zero value means none.
	Log *slog.Logger
	// Audit receives the node's audit records: the logins it refused and its members' moderator actions. Zero value means Log.
	Audit *slog.Logger
	// Now is the node's clock for what it times by the wall clock: the login and heartbeat
	// deadlines its sweep enforces, the heartbeat intervals it grants, login and logout times,
	// how long it remembers bans and room closes, the times in its reports, and how long a
	// room's messages have waited for its latency budget. Tests set it
	// to move time at will. Tickers, socket deadlines, the fan-out's ticks, budgets and flow
	// control, the login pace, and the seed of session ids stay on the real clock. Zero value
	// means time.Now.
	Now func() time.Time
}

// DefaultConfig returns the node's defaults of its tunable settings, what their zero values
// mean: `roomcast chatlink`'s and `roomcast dev`'s flags start from it. The fields it leaves
// zero mean what their comments say (EgressCapacity: unlimited; LatencyBudget: off; the
// pending-byte thresholds and the rest: fixed sizes, or derived from other fields).
func DefaultConfig() Config {
	return Config{
		LoginTimeout:      10 * time.Second,
		HeartbeatInterval: 25 * time.Second,
		FlushTick:         defaultFlushTick,
		OrderHold:         defaultOrderHold,
		OrderFillTimeout:  defaultOrderFillTimeout,
		GatherMessages:    defaultGatherMessages,
		PhaseMembers:      defaultPhaseMembers,
		SendWindow:        DefaultSendWindow,
		CounterWindow:     DefaultCounterWindow,
		CounterMaxAmount:  DefaultCounterMaxAmount,
		ViewerInterval:    DefaultViewerInterval,
		DrainSpread:       10 * time.Second,
		Limits:            DefaultLimits(),
	}
}

// withDefaults checks c and returns it with every zero field set to its default.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	switch {
	case !auth.ValidName(c.Node):
		return c, fmt.Errorf("chatlink: node name %q must be 1-128 characters of A-Z a-z 0-9 _ -", c.Node)
	case c.Bus == nil:
		return c, errors.New("chatlink: Config.Bus is required")
	case len(c.Keys) == 0:
		return c, errors.New("chatlink: Config.Keys needs at least one app")
	case c.Pool != "" && !auth.ValidName(c.Pool):
		return c, fmt.Errorf("chatlink: pool %q must be 1-128 characters of A-Z a-z 0-9 _ -", c.Pool)
	}
	for app, d := range c.MaxTokenLifetime {
		if _, ok := c.Keys[app]; !ok || d < 0 {
			return c, fmt.Errorf("chatlink: MaxTokenLifetime %v for app %q: want a lifetime of 0 or more for an app in Keys", d, app)
		}
	}
	if c.PublicWSURL != "" {
		u, err := url.Parse(c.PublicWSURL)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			return c, fmt.Errorf("chatlink: public WebSocket URL %q must be ws:// or wss:// with a host", c.PublicWSURL)
		}
	}
	if c.PublicTCPAddr != "" {
		if _, _, err := net.SplitHostPort(c.PublicTCPAddr); err != nil {
			return c, fmt.Errorf("chatlink: public TCP address %q: %w", c.PublicTCPAddr, err)
		}
	}
	if c.WSListen == "" {
		c.WSListen = "127.0.0.1:0"
	}
	if c.TCPListen == "" {
		c.TCPListen = "127.0.0.1:0"
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = 65536
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = d.LoginTimeout
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = d.HeartbeatInterval
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 3 * time.Second
	}
	if c.CounterWindow <= 0 {
		c.CounterWindow = d.CounterWindow
	}
	if c.CounterMaxAmount <= 0 {
		c.CounterMaxAmount = d.CounterMaxAmount
	}
	if c.ViewerInterval <= 0 {
		c.ViewerInterval = d.ViewerInterval
	}
	if c.MaxInflightSends <= 0 {
		c.MaxInflightSends = 32
	}
	if c.SendWindow == 0 {
		c.SendWindow = d.SendWindow
	}
	if c.HeartbeatMax <= 0 {
		c.HeartbeatMax = c.HeartbeatInterval * 12 / 5
	}
	if c.HeartbeatStep <= 0 {
		c.HeartbeatStep = c.HeartbeatInterval / 5
	}
	if c.FlushTick <= 0 {
		c.FlushTick = d.FlushTick
	}
	if c.OrderHold == 0 {
		c.OrderHold = d.OrderHold
	}
	if c.OrderFillTimeout <= 0 {
		c.OrderFillTimeout = d.OrderFillTimeout
	}
	if c.LatencyBudget < 0 {
		return c, fmt.Errorf("chatlink: latency budget %v must not be negative", c.LatencyBudget)
	}
	if c.GatherMessages <= 0 {
		c.GatherMessages = d.GatherMessages
	}
	if c.PhaseMembers <= 0 {
		c.PhaseMembers = d.PhaseMembers
	}
	if c.FlowT1 <= 0 {
		c.FlowT1 = DefaultFlowT1
	}
	if c.FlowT2 <= 0 {
		c.FlowT2 = DefaultFlowT2
	}
	if c.ThinAtPendingBytes <= 0 {
		c.ThinAtPendingBytes = 64 << 10
	}
	if c.CriticalOnlyAtPendingBytes <= 0 {
		c.CriticalOnlyAtPendingBytes = 256 << 10
	}
	if c.MaxPendingBytes <= 0 {
		c.MaxPendingBytes = 1 << 20
	}
	c.Limits = c.Limits.withDefaults()
	if c.MaxConnections <= 0 {
		c.MaxConnections = FileLimit() - 256
	}
	if c.ExprCacheSize <= 0 {
		c.ExprCacheSize = 1024
	}
	if c.DrainSpread <= 0 {
		c.DrainSpread = d.DrainSpread
	}
	if c.ReportInterval <= 0 {
		c.ReportInterval = time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Audit == nil {
		c.Audit = c.Log
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// FileLimit returns the process's soft limit on open files (at least 1280): what the
// connections of every ChatLink in the process share.
func FileLimit() int {
	n, ok := osdep.FileLimit()
	if !ok {
		return 1 << 20
	}
	return max(n, 1280)
}
