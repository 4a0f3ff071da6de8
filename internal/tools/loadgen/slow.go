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
	c, err := dialExtra(ctx, cfg, hc, room, uid, nil, rawHooks{})
	if err != nil {
		return nil, fmt.Errorf("slow member: %w", err)
	}
	return c, nil
}

// dialExtra logs in a raw member of the room besides the run's N (a slow one with a nil
// onMsg, a churning one): its token minted here, dialed from the default source address
// without a poller.
func dialExtra(ctx context.Context, cfg Config, hc *http.Client, room, uid string, onMsg func(int32, []byte), hooks rawHooks) (*rawClient, error) {
	tok, err := auth.Mint(cfg.Secret, cfg.App, uid, room, nil, 12*time.Hour) // well under the ChatLink's 24h maximum token lifetime
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	return dialRaw(ctx, hc, cfg.Dispatcher, cfg.Transport, tok, d.DialContext, spec{CAPEM: cfg.caPEM}.tlsConfig(), nil, onMsg, hooks)
}
