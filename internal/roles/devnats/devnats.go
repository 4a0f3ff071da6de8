// Package devnats starts a NATS server with JetStream inside this process, for the dev assembly
// (`roomcast dev`, internal/roles/devcluster) and for tests. Production roles connect to a NATS
// server they do not run: no component (chatlink, room, presence, dispatcher) may import this
// package, which would link the NATS server into it.
package devnats

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures an in-process NATS server.
type Config struct {
	// Host to listen on. Zero value means 127.0.0.1.
	Host string
	// Port to listen on. Zero value means a free port chosen by the system.
	Port int
	// StoreDir holds JetStream's data. Required.
	StoreDir string
	// Log receives the server's notices and errors; nil means none.
	Log *slog.Logger
}

// Start starts a NATS server with JetStream in this process and waits until it takes
// connections. Stop it with Shutdown and WaitForShutdown.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("devnats: embedded NATS needs a store directory")
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "roomcast-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      cfg.Log == nil,
		// Room batches can be large; keep NATS's default 1 MiB limit explicit.
		MaxPayload: 1 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("devnats: embedded NATS: %w", err)
	}
	if cfg.Log != nil {
		s.SetLoggerV2(&natsLogger{cfg.Log}, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("devnats: embedded NATS did not become ready in 10s")
	}
	return s, nil
}

// natsLogger adapts slog to the NATS server's logger.
type natsLogger struct{ log *slog.Logger }

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any)  {}
