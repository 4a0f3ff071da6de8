// Package roles starts Roomcast's roles from their configs: the services role (the room and
// presence services, the dispatcher, the server API over HTTP and gRPC, the CDN manager and
// optionally a CDN pusher), the ChatLink role (one edge node) and the CDN pusher role (one pusher
// instance), each with its private ops endpoint (metrics, health, readiness, liveness, profiles,
// admin routes) apart from its public ports. `roomcast services`, `roomcast chatlink`, `roomcast
// cdnpusher` and the dev assembly (internal/roles/devcluster) all start their roles here, so the
// wiring is written once. It only wires: no business logic (the components hold it), no flags
// (cmd/ parses them) and no NATS server (roles connect to one they are given).
package roles

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"roomcast/internal/bus"
	"roomcast/internal/certfiles"
)

// busConns dials a role's NATS connections, one per component, and closes them together.
type busConns struct {
	url  string
	opts []nats.Option
	log  *slog.Logger

	mu    sync.Mutex // guards conns: health checks read it while a restart adds to it
	conns []*nats.Conn
}

// connect dials NATS for the component called name.
func (b *busConns) connect(name string) (*nats.Conn, error) {
	nc, err := bus.Connect(b.url, name, b.log, b.opts...)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.conns = append(b.conns, nc)
	b.mu.Unlock()
	return nc, nil
}

// connected returns an error unless every connection is up.
func (b *busConns) connected() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, nc := range b.conns {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
	}
	return nil
}

func (b *busConns) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, nc := range b.conns {
		nc.Close()
	}
	b.conns = nil
}

// newRegistry returns a metrics registry with the Go runtime's and the process's collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// ListenError is a role's start failing because one of its listeners could not open: the
// address is in use, malformed or not this machine's. The command that set the address can
// name its flag.
type ListenError struct {
	// Listener is which one: "HTTP", "gRPC", "ops", "WebSocket" or "TCP".
	Listener string
	Addr     string
	Err      error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("roles: %s listener on %s: %v", e.Listener, e.Addr, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// listenError names the listener that could not open.
func listenError(what, addr string, err error) error {
	return &ListenError{Listener: what, Addr: addr, Err: err}
}

// checkListenAddr checks that addr is host:port with a port from 0 to 65535 (or a service
// name), so that a malformed address fails a role's start before it connects anywhere.
func checkListenAddr(what, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return listenError(what, addr, err)
	}
	return nil
}

// serverTLS loads a role's certificate files: the TLS config of its listeners, whose
// handshakes take up changed files (certfiles), logging reloads to log.
func serverTLS(files certfiles.Config, log *slog.Logger) (*tls.Config, error) {
	files.Log = log
	src, err := certfiles.New(files)
	if err != nil {
		return nil, fmt.Errorf("roles: %w", err)
	}
	return src.ServerConfig(), nil
}
