package testkit

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"roomcast/internal/roles/devnats"
)

// NATS starts an embedded NATS server with JetStream, as `roomcast dev` runs it, storing in a
// temporary directory; it is shut down when the test ends.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	s, err := devnats.Start(devnats.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects to s with opts; the connection is closed when the test ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
