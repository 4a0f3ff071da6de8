package sdk

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"roomcast/proto/clientpb"
)

// frameConn is one connection to a ChatLink, whatever carries the frames.
type frameConn interface {
	// serve reads frames and passes each to handle until the connection ends, and returns why
	// it ended: a *CloseError when the server closed it or it dropped, an ErrProtocol error
	// when the server broke the framing. It is called once, on the Client's reader goroutine.
	serve(handle func(*clientpb.Frame)) error
	// write sends one frame. It is safe for concurrent use.
	write(f *clientpb.Frame) error
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
		return dialTCP(ctx, ep.TCPAddr, ep.TCPTLS, cfg)
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

// handshakeTLS runs the client side of a TLS handshake over nc with host, bounded by ctx; it
// closes nc when the handshake fails.
func handshakeTLS(ctx context.Context, nc net.Conn, host string, cfg *Config) (net.Conn, error) {
	tcfg := cfg.TLS
	if tcfg.ServerName == "" {
		tcfg = tcfg.Clone()
		tcfg.ServerName = host
	}
	tc := tls.Client(nc, tcfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return tc, nil
}
