package chatlink

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/auth"
)

// Config configures a ChatLink node.
type Config struct {
	// Node names this node; it prefixes every session id, so it must be unique in the
	// deployment and a valid name (auth.ValidName). Required.
	Node string
	// Bus is the NATS connection. Required.
	Bus *nats.Conn
	// Keys verify login tokens, by app. Required.
	Keys auth.Keyring
	// WSListen is the address of the WebSocket listener (path /v1/ws). Zero value means
	// 127.0.0.1:0, a free port.
	WSListen string
	// TCPListen is the address of the length-prefixed TCP listener. Zero value means
	// 127.0.0.1:0, a free port.
	TCPListen string
	// PublicHost is the host clients reach this node at, put in the load reports the
	// dispatcher hands out. Zero value means the host of the listeners.
	PublicHost string
	// Region and ISP label this node for the dispatcher. Zero values mean unlabelled.
	Region, ISP string
	// MaxFrameBytes limits a client frame. Zero value means 65536.
	MaxFrameBytes int
	// LoginTimeout is how long a new connection may take to log in. Zero value means 10s.
	LoginTimeout time.Duration
	// HeartbeatInterval is the interval announced to clients; a connection silent for three
	// intervals is closed. Zero value means 25s.
	HeartbeatInterval time.Duration
	// RequestTimeout bounds each request to a service (join, send). Zero value means 3s.
	RequestTimeout time.Duration
	// MaxInflightSends bounds the sends one connection may have waiting for the room service
	// (they are forwarded one at a time, in order); more are refused with RATE_LIMITED. Zero
	// value means 32.
	MaxInflightSends int
	// MaxPendingBytes bounds the bytes queued for one TCP connection before it is closed as a
	// slow reader. Zero value means 4 MiB.
	MaxPendingBytes int
	// ReportInterval is how often a load report is published. Zero value means 1s.
	ReportInterval time.Duration
	// Registry receives the node's metrics, labelled node=<Node>. Zero value means none are
	// registered.
	Registry prometheus.Registerer
	// Log receives the node's logs. Zero value means none.
	Log *slog.Logger
}

func (c *Config) setDefaults() {
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
		c.LoginTimeout = 10 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 25 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 3 * time.Second
	}
	if c.MaxInflightSends <= 0 {
		c.MaxInflightSends = 32
	}
	if c.MaxPendingBytes <= 0 {
		c.MaxPendingBytes = 4 << 20
	}
	if c.ReportInterval <= 0 {
		c.ReportInterval = time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}
