package roles

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/chatlink"
	"roomcast/internal/certfiles"
)

// ChatLinkConfig configures the ChatLink role.
type ChatLinkConfig struct {
	// NATSURL is the NATS server's URL(s), comma-separated. Required.
	NATSURL string
	// NATSOptions add to the options of the node's NATS connection (bus.Connect); the dev
	// assembly passes nats.InProcessServer. Zero value means none.
	NATSOptions []nats.Option
	// Node configures the node; its Bus and Registry are set here (and its TLS from the TLS
	// files), and its Log receives the role's logs too.
	Node chatlink.Config
	// TLS, when it names files, makes the node's listeners wss:// and TLS TCP, with the
	// certificate re-read when the files change (certfiles). Zero value means Node.TLS as given
	// (nil: plaintext).
	TLS certfiles.Config
	// Registry receives the node's metrics and is served on the ops endpoint. Zero value means
	// a new registry with the Go runtime's and the process's collectors.
	Registry *prometheus.Registry
	// OpsListen is the address of the node's /metrics, /healthz, /readyz, /livez and
	// /debug/pprof/: keep it private. Zero value means no ops endpoint (the dev assembly serves its nodes' metrics on
	// the services' endpoint).
	OpsListen string
}

func (c ChatLinkConfig) withDefaults() (ChatLinkConfig, error) {
	if c.NATSURL == "" {
		return c, errors.New("roles: ChatLinkConfig.NATSURL is required")
	}
	if c.Registry == nil {
		c.Registry = newRegistry()
	}
	if c.Node.Log == nil {
		c.Node.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// ChatLink is a running ChatLink role.
type ChatLink struct {
	Node *chatlink.Node
	// Registry is the one served on /metrics (ChatLinkConfig.Registry).
	Registry *prometheus.Registry

	bus          *busConns
	ops          *opsEndpoint
	shutdownOnce sync.Once
	shutdownErr  error
}

// StartChatLink connects to NATS, starts the node and serves its ops endpoint. On error,
// whatever had started is stopped.
func StartChatLink(cfg ChatLinkConfig) (_ *ChatLink, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Node.Log
	c := &ChatLink{bus: &busConns{url: cfg.NATSURL, opts: cfg.NATSOptions, log: log}}
	defer func() {
		if err != nil {
			_ = c.Shutdown(context.Background())
		}
	}()
	// The certificate and the ops listener first: a bad file or an address in use fails the
	// start before the node takes its name's lease.
	ncfg := cfg.Node
	if cfg.TLS.Enabled() {
		if ncfg.TLS, err = serverTLS(cfg.TLS, log); err != nil {
			return nil, err
		}
	}
	// The node opens its listeners after it connects: a malformed address fails here, before.
	for _, l := range nodeListeners(ncfg) {
		if l.addr == "" { // the node's default
			continue
		}
		if err = checkListenAddr(l.what, l.addr); err != nil {
			return nil, err
		}
	}
	if c.ops, err = listenOps(cfg.OpsListen); err != nil {
		return nil, err
	}
	if ncfg.Bus, err = c.bus.connect("chatlink " + ncfg.Node); err != nil {
		return nil, err
	}
	ncfg.Registry = cfg.Registry
	node, err := chatlink.New(ncfg)
	if err != nil {
		return nil, err
	}
	// A node whose Start fails has stopped what it started: Shutdown is for started nodes.
	if err = node.Start(); err != nil {
		return nil, nodeListenError(ncfg, err)
	}
	c.Node, c.Registry = node, cfg.Registry
	c.ops.serve(newMux(cfg.Registry, c.health, c.ready, true), log)
	return c, nil
}

// nodeListenError names the node's listener that a start error of the node's comes from, when
// it is one: a ListenError, like the role's own listeners'.
func nodeListenError(cfg chatlink.Config, err error) error {
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr.Op != "listen" || opErr.Addr == nil {
		return err
	}
	for _, l := range nodeListeners(cfg) {
		if sameAddr(l.addr, opErr.Addr) {
			return listenError(l.what, l.addr, err)
		}
	}
	return err
}

// nodeListeners names a node's listeners and their addresses.
func nodeListeners(cfg chatlink.Config) []struct{ what, addr string } {
	return []struct{ what, addr string }{{"WebSocket", cfg.WSListen}, {"TCP", cfg.TCPListen}}
}

// sameAddr reports whether the listen address addr resolves to a.
func sameAddr(addr string, a net.Addr) bool {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	return err == nil && ta.String() == a.String()
}

// health makes the node unavailable while its NATS connection is down: it can neither log
// clients in nor hear its rooms.
func (c *ChatLink) health(h *Health) error {
	conns := c.Node.Connections()
	h.Node, h.Connections = c.Node.Name(), &conns
	return c.bus.connected()
}

// ready makes the node unready while its NATS connection is down or it drains: a load
// balancer should send it no new clients.
func (c *ChatLink) ready() error {
	if c.Node.Draining() {
		return errors.New("draining")
	}
	return c.bus.connected()
}

// OpsAddr returns the host:port of the ops endpoint, or "" without one.
func (c *ChatLink) OpsAddr() string { return c.ops.addr() }

// Shutdown shuts the node down (chatlink.Node.Shutdown: its clients are told to reconnect
// elsewhere, and closed when ctx ends), then stops the ops endpoint and closes the NATS
// connection. It may be called more than once, and after the node drained; later calls return
// the first call's result.
func (c *ChatLink) Shutdown(ctx context.Context) error {
	c.shutdownOnce.Do(func() {
		if c.Node != nil {
			c.shutdownErr = c.Node.Shutdown(ctx)
		}
		c.ops.stop()
		c.bus.close()
	})
	return c.shutdownErr
}
