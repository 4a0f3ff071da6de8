package sdk

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"roomcast/proto/clientpb"
)

// Transports for Config.Transport.
const (
	TransportWebSocket = "ws"
	TransportTCP       = "tcp"
)

// ClientName is what the SDK reports in Login.client.
const ClientName = "roomcast-go/0.2"

// ProtocolVersion is the version of the wire protocol (docs/protocol.md) the SDK speaks.
const ProtocolVersion = 1

// MaxFrameSize is the largest frame either side may send: the protobuf bytes of one Frame,
// without the TCP length prefix.
const MaxFrameSize = 65536

const (
	defaultAttemptTimeout    = 10 * time.Second
	defaultWriteTimeout      = 10 * time.Second
	defaultHeartbeatInterval = 25 * time.Second
	minHeartbeatInterval     = 10 * time.Millisecond // a floor against a server's typo
	defaultMessageBuffer     = 4096
	defaultDevice            = "go"
	defaultReconnectMinDelay = 500 * time.Millisecond
	defaultReconnectMaxDelay = 20 * time.Second
	defaultStableAfter       = 10 * time.Second
	defaultRecoveryWait      = 10 * time.Second
	defaultDedupeWindow      = 1000
	maxHistory               = 100 // Login.history's limit
)

// Config says where and how a Client connects and where its events go. Only Token and one of
// Dispatcher or Endpoints are required.
type Config struct {
	// Token is the login JWT minted by the app server. Dial reads (without verifying) its app,
	// uid and room claims for the dispatch query. Required.
	Token string

	// Dispatcher is the base URL of the dispatcher, e.g. "http://127.0.0.1:8080". Dial asks
	// GET {Dispatcher}/v1/dispatch for endpoints. Required unless Endpoints is set, and then
	// ignored.
	Dispatcher string

	// Endpoints, if not empty, are dialed in order instead of asking the dispatcher.
	Endpoints []Endpoint

	// Transport is TransportWebSocket or TransportTCP. Zero value means TransportWebSocket.
	Transport string

	// Device is sent in Login.device, e.g. "web", "ios", "pc". Zero value means "go".
	Device string
	// RecoverSince, the id of the last message the app has from an earlier Client
	// (Client.LastID), makes the first login recover the room's kept messages after it
	// (critical and normal lanes, those the member's tags allow); a RecoveredEvent follows them.
	// Reconnects recover from the last message received, whatever this says. Zero value means
	// none.
	RecoverSince string
	// History, without RecoverSince, asks the first login for the room's last History kept
	// messages (at most 100); a RecoveredEvent follows them. Zero value means none.
	History int

	// NoReconnect makes the Client stop when its connection ends, for whatever reason, instead
	// of reconnecting (tools that count what a connection gets want that). Zero value means the
	// Client reconnects after every end but a terminal close code (4000–4499) or Close.
	NoReconnect bool
	// ReconnectMinDelay is about the wait before the first reconnect; each failed attempt
	// doubles it, up to ReconnectMaxDelay. Each wait is half fixed, half random. Zero values
	// mean 500ms and 20s.
	ReconnectMinDelay, ReconnectMaxDelay time.Duration
	// StableAfter is how long a connection must have stayed up for its end to start the backoff
	// afresh; a server that accepts logins and then fails keeps the client backing off. Zero
	// value means 10s.
	StableAfter time.Duration
	// RecoveryWait bounds the wait for a login's history: live messages are held meanwhile, so
	// that everything is handed on in order. Zero value means 10s: the ChatLink answers within
	// 8s (it gives up reading the history then and says so with an Error 503), and the wait must
	// outlast that, or a slow answer is reported as a failed recovery that the server completes.
	RecoveryWait time.Duration
	// DedupeWindow is how many of the latest message ids the Client remembers to drop
	// duplicates, which arrive only within a recovery's reach: keep it above the room's history
	// (100 unless the deployment keeps more). Zero value means 1,000; a negative one turns
	// de-duplication off (tools that check the server want to see its duplicates).
	DedupeWindow int

	// HTTPClient is used for the dispatch request, and its Transport decides whether the
	// connection to the dispatcher is kept for the next request: a process that dials many
	// clients (a load generator, a server-side bot) should give one client to all of them and
	// reuse connections. Nil means http.DefaultClient with the connection closed after the
	// request: a Client dispatches once per Dial, so a kept connection would only idle.
	HTTPClient *http.Client

	// Dialer opens the TCP connection to a ChatLink, for both transports (for wss the TLS
	// handshake runs over it, as for TLS TCP), e.g. to choose the local address with
	// net.Dialer.LocalAddr.
	// Nil means a zero net.Dialer.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

	// TLS configures the TLS client of wss:// endpoints and of TCP endpoints the dispatcher
	// marks tcp_tls, e.g. RootCAs for a private CA; ServerName is set per endpoint (its host)
	// when empty. With HTTPClient nil, it also configures the dispatch request over https://.
	// Nil means the system's roots and TLS 1.2 at least.
	TLS *tls.Config

	// Region is the member's region as the dispatcher names them (e.g. "AS/CN"). In CDN mode
	// the Client polls the vendors that list it or list no region; if none does, all of them.
	// Zero value means only the vendors that list no region (all, if every one lists some).
	Region string
	// CDNHTTPClient fetches the room's segments in CDN mode; give one to many Clients of a
	// process to share connections. Nil means the Client's own, with keep-alive connections
	// (and the TLS settings of Config.TLS), closed when the Client stops.
	CDNHTTPClient *http.Client

	// AttemptTimeout bounds connecting to and logging in at one endpoint, so that a hanging
	// endpoint gives way to the next. Zero value means 10s.
	AttemptTimeout time.Duration

	// HeartbeatInterval, when shorter than the interval the server asks for (its LoginAck's
	// and HeartbeatAcks'), is how often the Client sends a Heartbeat instead; a connection
	// from which nothing arrived for three intervals is given up (ErrServerTimeout). A mobile
	// app on a network that drops idle connections (a carrier's NAT) shortens it to keep the
	// connection and to notice a dead one sooner, at the cost of waking the radio more often.
	// Zero value means the server's interval (25s by default).
	HeartbeatInterval time.Duration

	// WriteTimeout bounds each write to the connection; a write that takes longer ends the
	// connection. Zero value means 10s.
	WriteTimeout time.Duration

	// MessageBuffer is about how many messages may wait for OnMessage. Past it the connection
	// ends with ErrSlowConsumer rather than stall its reader (which would delay acks and
	// heartbeats) or drop messages silently; the Client reconnects and recovers what it missed
	// meanwhile (with NoReconnect it stops). Zero value means 4096.
	MessageBuffer int

	// OnMessage receives every message of the room once, ordered by (server time, id), on one
	// goroutine owned by the Client, the same that calls OnEvent. It must not call Close (Close
	// waits for it); a slow OnMessage fills MessageBuffer. Nil means messages are discarded.
	OnMessage func(*clientpb.Message)

	// OnEvent receives the Client's events (connected, reconnecting, recovered, thinned,
	// kicked, limited, error, closed; see Event) on the OnMessage goroutine, in order with the
	// messages. The last is a *ClosedEvent. It must not call Close. Nil means none.
	OnEvent func(Event)

	// Logger receives the Client's few log lines. Nil means no logging.
	Logger *slog.Logger

	closeDispatch bool // set by withDefaults: the dispatch request closes its connection
}

// Endpoint is one ChatLink as the dispatcher describes it.
type Endpoint struct {
	// Node is the ChatLink's name, e.g. "cl-1".
	Node string `json:"node"`
	// WSURL is its WebSocket URL, e.g. "ws://127.0.0.1:9101/v1/ws".
	WSURL string `json:"ws_url"`
	// TCPAddr is its TCP address, e.g. "127.0.0.1:9201".
	TCPAddr string `json:"tcp_addr"`
	// TCPTLS says the TCP transport at TCPAddr is TLS.
	TCPTLS bool `json:"tcp_tls,omitempty"`
}

// withDefaults returns c with the zero values replaced by the documented defaults, or an error
// for a Config Dial cannot use.
func (c Config) withDefaults() (Config, error) {
	if c.Transport == "" {
		c.Transport = TransportWebSocket
	}
	switch {
	case c.Transport != TransportWebSocket && c.Transport != TransportTCP:
		return c, fmt.Errorf("roomcast: unknown transport %q (want %q or %q)", c.Transport, TransportWebSocket, TransportTCP)
	case c.Token == "":
		return c, fmt.Errorf("%w: no token", ErrBadToken)
	case len(c.Endpoints) == 0 && c.Dispatcher == "":
		return c, errors.New("roomcast: Config needs Dispatcher or Endpoints")
	}
	if c.Device == "" {
		c.Device = defaultDevice
	}
	if c.HTTPClient == nil {
		c.HTTPClient, c.closeDispatch = http.DefaultClient, true
		if c.TLS != nil { // the app's TLS settings hold for its dispatcher too
			c.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: c.TLS.Clone(), Proxy: http.ProxyFromEnvironment}}
		}
	}
	if c.TLS == nil {
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.Dialer == nil {
		var d net.Dialer
		c.Dialer = d.DialContext
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = defaultAttemptTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = defaultWriteTimeout
	}
	if c.MessageBuffer <= 0 {
		c.MessageBuffer = defaultMessageBuffer
	}
	if c.ReconnectMinDelay <= 0 {
		c.ReconnectMinDelay = defaultReconnectMinDelay
	}
	if c.ReconnectMaxDelay <= 0 {
		c.ReconnectMaxDelay = defaultReconnectMaxDelay
	}
	c.ReconnectMaxDelay = max(c.ReconnectMaxDelay, c.ReconnectMinDelay)
	if c.StableAfter <= 0 {
		c.StableAfter = defaultStableAfter
	}
	if c.RecoveryWait <= 0 {
		c.RecoveryWait = defaultRecoveryWait
	}
	if c.DedupeWindow == 0 {
		c.DedupeWindow = defaultDedupeWindow
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
