package chatlink

import (
	"crypto/tls"
	"net"
	"time"
)

// A node with Config.TLS serves both transports over TLS. Its listeners stay plain TCP
// listeners: each accepted connection's handshake runs on the short-lived goroutine that
// accepted it, and the connection then takes the reader-goroutine path (serveWSReader, serveTCP)
// with plain writes, since the poller and the io_uring batch sends (polled.go, sockwriter.go,
// batch.go) read and write the socket's bytes directly, which would bypass the encryption.
// Plain connections keep their path unchanged.

// tlsHandshakeTimeout bounds a client's TLS handshake.
const tlsHandshakeTimeout = 5 * time.Second

// handshakeTLS runs the server side of nc's TLS handshake and returns the TLS connection, or
// nil, with nc closed, when the handshake fails or times out. nc's deadline is left set: the
// caller clears it when its own setup is done.
func (n *Node) handshakeTLS(nc net.Conn) *tls.Conn {
	_ = nc.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	tc := tls.Server(nc, n.cfg.TLS)
	if err := tc.Handshake(); err != nil {
		n.log.Debug("tls handshake", "remote", nc.RemoteAddr().String(), "err", err)
		n.handshakeFailed(nc, "tls", err)
		_ = nc.Close()
		return nil
	}
	return tc
}

// startTLSTCP serves a length-prefixed TCP connection inside TLS, on a reader goroutine of
// its own started after the handshake: the handshake's deep calls stay off the stack the
// reader keeps for the connection's life.
func (n *Node) startTLSTCP(nc net.Conn) {
	tc := n.handshakeTLS(nc)
	if tc == nil {
		n.limits.closed(peerAddr(nc)) // admitted by acceptTCP
		return
	}
	_ = tc.SetDeadline(time.Time{})
	n.wg.Add(1) // serveTCP tells n.wg when done
	go n.serveTCP(tc)
}
