package roles

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/cdnpusher"
)

// PusherConfig configures the CDN pusher role: one pusher instance (`roomcast cdnpusher`).
type PusherConfig struct {
	// NATSURL is the NATS server's URL(s), comma-separated. Required.
	NATSURL string
	// NATSOptions add to the options of the NATS connection (bus.Connect). Zero value means
	// none.
	NATSOptions []nats.Option
	// Pusher configures the instance: storage, window, cap. Its Bus is set here, and its
	// Logger and Registerer when unset.
	Pusher cdnpusher.ServiceConfig
	// Registry receives the metrics and is served on the ops endpoint. Zero value means a new
	// registry with the Go runtime's and the process's collectors.
	Registry *prometheus.Registry
	// OpsListen is the address of /metrics, /healthz, /readyz, /livez and /debug/pprof/: keep
	// it private. Zero
	// value means none.
	OpsListen string
	// Log receives the role's logs. Zero value means none.
	Log *slog.Logger
}

func (c PusherConfig) withDefaults() (PusherConfig, error) {
	if c.NATSURL == "" {
		return c, errors.New("roles: PusherConfig.NATSURL is required")
	}
	if c.Registry == nil {
		c.Registry = newRegistry()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Pusher is a running CDN pusher role.
type Pusher struct {
	Service *cdnpusher.Service

	bus          *busConns
	ops          *opsEndpoint
	shutdownOnce sync.Once
	shutdownErr  error
}

// StartPusher connects to NATS, starts a pusher instance and serves its ops endpoint. On error,
// whatever had started is stopped.
func StartPusher(cfg PusherConfig) (_ *Pusher, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	p := &Pusher{bus: &busConns{url: cfg.NATSURL, opts: cfg.NATSOptions, log: cfg.Log}}
	defer func() {
		if err != nil {
			_ = p.Shutdown(context.Background())
		}
	}()
	if p.ops, err = listenOps(cfg.OpsListen); err != nil {
		return nil, err
	}
	if p.Service, err = startPusherService(p.bus, cfg.Pusher, cfg.Registry, cfg.Log); err != nil {
		return nil, err
	}
	p.ops.serve(newMux(cfg.Registry, func(*Health) error { return p.bus.connected() }, p.bus.connected, true), cfg.Log)
	return p, nil
}

// startPusherService starts a pusher instance on a NATS connection of its own: the wiring the
// pusher role and the services role share.
func startPusherService(b *busConns, cfg cdnpusher.ServiceConfig, reg prometheus.Registerer, log *slog.Logger) (*cdnpusher.Service, error) {
	var err error
	if cfg.Bus, err = b.connect("cdnpusher " + cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Pusher.Logger == nil {
		cfg.Pusher.Logger = log
	}
	if cfg.Pusher.Registerer == nil {
		cfg.Pusher.Registerer = reg
	}
	return cdnpusher.StartService(cfg)
}

// OpsAddr returns the host:port of the ops endpoint, or "" without one.
func (p *Pusher) OpsAddr() string { return p.ops.addr() }

// Shutdown hands the instance's rooms to other pushers and stops it (cdnpusher.Service.Shutdown
// with ctx), then stops the ops endpoint and closes the NATS connection. It may be called more
// than once; later calls return the first call's result.
func (p *Pusher) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		if p.Service != nil {
			p.shutdownErr = p.Service.Shutdown(ctx)
		}
		p.ops.stop()
		p.bus.close()
	})
	return p.shutdownErr
}
