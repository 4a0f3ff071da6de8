package mobile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"time"

	"roomcast/sdk"
)

// Transports for Config.Transport.
const (
	TransportWebSocket = sdk.TransportWebSocket
	TransportTCP       = sdk.TransportTCP
)

const (
	defaultDevice         = "mobile"
	defaultConnectTimeout = 30 * time.Second
	defaultSendTimeout    = 10 * time.Second
)

// Config says where and how a Client connects. Only Token and Dispatcher are required. From
// Java or Kotlin, `new Config()` and its setters; from Swift, `MobileConfig()` and its
// properties.
type Config struct {
	// Token is the login JWT minted by the app server. Required.
	Token string
	// Dispatcher is the base URL of the dispatcher, e.g. "https://chat.example.com"; the
	// Client asks its /v1/dispatch for ChatLinks. Required.
	Dispatcher string
	// Transport is TransportWebSocket ("ws") or TransportTCP ("tcp"). Zero value means
	// TransportWebSocket.
	Transport string
	// Device is sent in the login, e.g. "android" or "ios". Zero value means "mobile".
	Device string

	// RecoverSince, the id of the last message the app has from an earlier Client
	// (Client.LastID, saved before the app was stopped), makes the first login recover the
	// room's kept messages after it; a "recovered" event follows them. Zero value means none.
	RecoverSince string
	// History, without RecoverSince, asks the first login for the room's last History kept
	// messages (at most 100); a "recovered" event follows them. Zero value means none.
	History int

	// NoReconnect makes the Client stop when its connection ends instead of reconnecting.
	// Zero value means the Client reconnects after every end but a terminal close code
	// (4000–4499) or Close.
	NoReconnect bool
	// ReconnectMinDelayMs and ReconnectMaxDelayMs bound the backoff between reconnects, in
	// milliseconds. Zero values mean 500 and 20,000.
	ReconnectMinDelayMs, ReconnectMaxDelayMs int64

	// ConnectTimeoutMs bounds NewClient: dispatching, connecting and the first login, in
	// milliseconds. Zero value means 30,000.
	ConnectTimeoutMs int64
	// SendTimeoutMs bounds each Send, waiting for a connection while the Client reconnects
	// included, in milliseconds. Zero value means 10,000.
	SendTimeoutMs int64
	// HeartbeatIntervalMs, when shorter than the server's interval (25,000 by default), is
	// how often the Client sends a heartbeat, in milliseconds; a connection silent for three
	// intervals is given up and the Client reconnects. Shorter keeps a carrier's NAT from
	// dropping an idle connection and notices a dead one sooner, but wakes the radio more
	// often. Zero value means the server's.
	HeartbeatIntervalMs int64
	// BackgroundLingerMs is how long the Client keeps its connection after EnterBackground
	// before it leaves it (and pauses until EnterForeground), in milliseconds. Zero value
	// means 25,000; a negative one keeps the connection in the background (an Android app
	// with a foreground service).
	BackgroundLingerMs int64

	// RootCAsPEM, if not empty, is the PEM of the certificates (one or more) the Client trusts
	// for wss://, TLS over TCP and an https:// Dispatcher instead of the system's: a private
	// CA's, or a test deployment's self-signed one. Zero value means the system's roots.
	RootCAsPEM string

	// Logger receives the Client's few log lines at LogLevel and above. Nil means none.
	Logger Logger
	// LogLevel is the least level passed to Logger: LogDebug, LogInfo, LogWarn or LogError.
	// Zero value means LogInfo.
	LogLevel int

	// MessageBuffer is about how many messages may wait for Listener.OnMessage; past it the
	// Client reconnects and recovers rather than stall. Zero value means 4096.
	MessageBuffer int
}

// withDefaults returns c with the facade's zero values replaced by its defaults; the Go SDK
// fills the rest.
func (c Config) withDefaults() Config {
	if c.Device == "" {
		c.Device = defaultDevice
	}
	if c.ConnectTimeoutMs <= 0 {
		c.ConnectTimeoutMs = defaultConnectTimeout.Milliseconds()
	}
	if c.SendTimeoutMs <= 0 {
		c.SendTimeoutMs = defaultSendTimeout.Milliseconds()
	}
	if c.BackgroundLingerMs == 0 {
		c.BackgroundLingerMs = defaultBackgroundLinger.Milliseconds()
	}
	return c
}

// sdkConfig returns the Go SDK's Config for c, without the callbacks, or an error for a
// RootCAsPEM without a certificate.
func (c Config) sdkConfig() (sdk.Config, error) {
	sc := sdk.Config{
		Token:             c.Token,
		Dispatcher:        c.Dispatcher,
		Transport:         c.Transport,
		Device:            c.Device,
		RecoverSince:      c.RecoverSince,
		History:           c.History,
		NoReconnect:       c.NoReconnect,
		ReconnectMinDelay: millis(c.ReconnectMinDelayMs),
		ReconnectMaxDelay: millis(c.ReconnectMaxDelayMs),
		MessageBuffer:     c.MessageBuffer,
		HeartbeatInterval: millis(c.HeartbeatIntervalMs),
	}
	if c.RootCAsPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(c.RootCAsPEM)) {
			return sc, errors.New("roomcast: Config.RootCAsPEM holds no PEM certificate")
		}
		sc.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if c.Logger != nil {
		sc.Logger = slog.New(&logHandler{l: c.Logger, min: slog.Level(c.LogLevel)})
	}
	return sc, nil
}

func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
