package sdk

import (
	"context"
	"fmt"

	"roomcast/proto/roomcastpb"
)

// frameConn is one connection to a ChatLink, whatever carries the frames.
type frameConn interface {
	// serve reads frames and passes each to handle until the connection ends, and returns why
	// it ended: a *CloseError when the server closed it or it dropped, an ErrProtocol error
	// when the server broke the framing. It is called once, on the Client's reader goroutine.
	serve(handle func(*roomcastpb.Frame)) error
	// write sends one frame. It is safe for concurrent use.
	write(f *roomcastpb.Frame) error
	// close ends the connection, which makes serve return. It may be called more than once.
	close()
}

// dialTransport connects to ep with the configured transport.
func dialTransport(ctx context.Context, cfg *Config, ep Endpoint) (frameConn, error) {
	switch cfg.Transport {
	case TransportWebSocket:
		if ep.WSURL == "" {
			return nil, fmt.Errorf("%w: endpoint %q has no ws_url", ErrNoEndpoints, ep.Node)
		}
		return dialWS(ctx, ep.WSURL, cfg)
	case TransportTCP:
		if ep.TCPAddr == "" {
			return nil, fmt.Errorf("%w: endpoint %q has no tcp_addr", ErrNoEndpoints, ep.Node)
		}
		return dialTCP(ctx, ep.TCPAddr, cfg)
	default:
		return nil, fmt.Errorf("roomcast: unknown transport %q", cfg.Transport)
	}
}

// endpointAddr is the address of ep that transport dials, for messages.
func endpointAddr(ep Endpoint, transport string) string {
	if transport == TransportTCP {
		return ep.TCPAddr
	}
	return ep.WSURL
}
