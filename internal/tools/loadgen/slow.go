package loadgen

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"roomcast/internal/auth"
)

// slowReceiveBuffer is the socket receive buffer of a slow member: small, so that the
// server's backlog for it grows soon after it stops reading.
const slowReceiveBuffer = 4096

// dialSlow logs a slow member in (fanout --slow): a raw connection that sends its login and
// then never reads, like an app that froze or a client behind a stalled network. The server
// must not let it delay the room, and must handle it as a slow reader.
func dialSlow(ctx context.Context, cfg Config, hc *http.Client, room, uid string) (*rawClient, error) {
	tok, err := auth.Mint(cfg.Secret, cfg.App, uid, room, nil, 12*time.Hour) // well under the ChatLink's 24h maximum token lifetime
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := dialRaw(ctx, hc, cfg.Dispatcher, cfg.Transport, tok, d.DialContext, spec{CAPEM: cfg.caPEM}.tlsConfig(), nil, nil, rawHooks{})
	if err != nil {
		return nil, fmt.Errorf("slow member: %w", err)
	}
	return c, nil
}
