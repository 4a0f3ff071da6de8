package chatlink

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"roomcast/chatlink/internal/tlswire"
	"roomcast/internal/netpoll"
)

// A node with Config.TLS serves both transports over TLS, driven by the same poller and
// written through the same writer as plain connections (polled.go, sockwriter.go): an idle
// TLS connection holds no goroutine. Its listeners stay plain TCP listeners: each accepted
// connection's handshake (and, for WebSocket, its upgrade) runs on the short-lived goroutine
// that accepted it, over a tlswire.Wire that reads and writes the socket as any net.Conn does.
// Then the Wire is polled: the poller's reads append the socket's bytes to it, and the
// tls.Conn's Read is called only when a whole record is there, so that crypto/tls decrypts
// from memory and never waits (readTLS). What the node writes is sealed into records by the
// tls.Conn, which hands them to the connection's sockWriter to send or queue, in the order
// they were sealed (sendTLS, claimSealed). Without a poller (Config.ReaderGoroutines, or no
// epoll), TLS connections get a reader goroutine as plain ones do.

// tlsHandshakeTimeout bounds a client's TLS handshake.
const tlsHandshakeTimeout = 5 * time.Second

// handshakeTLS runs the server side of nc's TLS handshake and returns the TLS connection and
// the Wire under it, or nil, with nc closed, when the handshake fails or times out. nc's
// deadline is left set: the caller clears it when its own setup is done.
func (n *Node) handshakeTLS(nc net.Conn) (*tls.Conn, *tlswire.Wire) {
	_ = nc.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	wire := tlswire.New(nc)
	tc := tls.Server(wire, n.cfg.TLS)
	if err := tc.Handshake(); err != nil {
		n.log.Debug("tls handshake", "remote", nc.RemoteAddr().String(), "err", err)
		n.handshakeFailed(nc, "tls", err)
		_ = nc.Close()
		return nil, nil
	}
	return tc, wire
}

// startTLSTCP serves a length-prefixed TCP connection inside TLS: read by the node's poller, or
// by a reader goroutine of its own started after the handshake (its deep calls stay off the
// stack the reader keeps for the connection's life).
func (n *Node) startTLSTCP(nc net.Conn) {
	tc, wire := n.handshakeTLS(nc)
	if tc == nil {
		n.limits.closed(peerAddr(nc)) // admitted by acceptTCP
		return
	}
	_ = nc.SetDeadline(time.Time{})
	if sock, ok := nc.(*net.TCPConn); ok && n.poll != nil {
		p, err := newPolled(n, sock)
		if err != nil {
			n.limits.closed(peerAddr(nc))
			_ = nc.Close()
			return
		}
		p.feed = p.tcpFeed
		w := newSockWriter(p, false)
		p.overTLS(tc, wire, w) // before the conn is in the node's table, for the sweep
		p.c = n.newConn(w, peerAddr(nc))
		p.start(nil)
		return
	}
	n.m.tlsSessions.WithLabelValues("crypto_tls").Inc()
	n.wg.Add(1) // serveTCP tells n.wg when done
	go n.serveTCP(tc)
}

// overTLS makes p a TLS connection, written by w: from now on the Wire holds only what the
// poller's reads bring. Its records are opened and sealed by the record layer taken over from
// crypto/tls (tlswire.Detach), which keeps a TLS 1.3 connection's keys in a few hundred bytes
// and builds its ciphers only while it is used; where the tls.Conn cannot be taken over (TLS
// 1.2, ChaCha20), crypto/tls opens and seals them, and every record it seals goes to w.
func (p *polled) overTLS(tc *tls.Conn, wire *tlswire.Wire, w *sockWriter) {
	p.wire, p.tlsW = wire, w
	if rec, ok := detach(tc, wire); ok {
		p.rec, w.rec = rec, rec
		wire.Poll(nil)
		p.n.m.tlsSessions.WithLabelValues("roomcast").Inc()
		return
	}
	p.n.m.tlsSessions.WithLabelValues("crypto_tls").Inc()
	p.tls, w.tls = tc, tc
	wire.Poll(w.appendSealed)
}

// detach takes tc's record layer over (tlswire.Detach) when crypto/tls is between two records
// of the Wire's, as it is after a handshake and an upgrade.
func detach(tc *tls.Conn, wire *tlswire.Wire) (*tlswire.Session, bool) {
	if !wire.AtBoundary() {
		return nil, false
	}
	return tlswire.Detach(tc)
}

// sealing reports whether w seals what it writes (a TLS connection).
func (w *sockWriter) sealing() bool { return w.rec != nil || w.tls != nil }

// seal seals plain into records, after the records sealed before, and reports whether it could.
func (w *sockWriter) seal(plain []byte) bool {
	if w.rec == nil {
		_, err := w.tls.Write(plain) // the Wire hands the records to appendSealed
		return err == nil
	}
	w.sealWith(func(dst []byte) []byte { return w.rec.Seal(dst, plain) })
	return true
}

// sealWith appends what f seals with the record layer to the records sealed before, unless
// the writer is closing: nothing is sealed after the close_notify (sendTLS), nor after a close.
// f runs under mu.
func (w *sockWriter) sealWith(f func(dst []byte) []byte) {
	w.mu.Lock()
	if !w.closed && !w.closeAfter {
		w.sealed = f(w.sealed)
	}
	w.mu.Unlock()
}

// dropIdleCipher lets the sending cipher of a connection that sealed nothing since the last
// call go (the node's sweep calls it every second or so).
func (w *sockWriter) dropIdleCipher() {
	if w.rec == nil {
		return
	}
	w.mu.Lock()
	w.rec.DropIdleOut()
	w.mu.Unlock()
}

// plainBufs hold a record's plaintext, at most 16 KiB, while its frames are handled.
var plainBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// readTLS reads what the socket has, and handles the frames of the whole records in it.
func (p *polled) readTLS() readNext {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	n, eof, err := netpoll.ReadNow(p.rc, *bp)
	if err != nil || eof {
		return readClose
	}
	p.wire.Append((*bp)[:n])
	next := p.openRecords()
	p.settleTLS() // before the buffer goes back to the pool
	return next
}

// settleTLS ends a read of a TLS connection: the Wire keeps only part of a record, if any, and
// the record layer lets its reading cipher go, or the tls.Conn gives back its read buffers
// (tlswire.Release), as the connection goes idle.
func (p *polled) settleTLS() {
	p.wire.Settle()
	if p.rec != nil {
		p.rec.DropIn()
		return
	}
	tlswire.Release(p.tls)
}

// openRecords decrypts the whole records the Wire holds and handles the frames in them; an
// incomplete frame waits in pending as over plain connections.
func (p *polled) openRecords() readNext {
	if !p.wire.HasRecord() {
		return readOn
	}
	if p.rec != nil {
		return p.openDetached()
	}
	bp := plainBufs.Get().(*[]byte)
	defer plainBufs.Put(bp)
	next := readOn
	for next == readOn && p.wire.HasRecord() {
		n, err := p.tls.Read(*bp)
		if n > 0 {
			next = p.consumePlain((*bp)[:n])
		}
		if errors.Is(err, tlswire.ErrWouldBlock) {
			break // a record that was no data (a key update): nothing more is whole
		}
		if err != nil {
			next = readClose // a bad record, an alert, the client's close_notify
		}
	}
	p.tlsW.dispatchSealed(false) // what crypto/tls wrote while reading (a key update's answer)
	return next
}

// openDetached opens the whole records the Wire holds with the record layer, answering a key
// update the client asks for, and sending the alert of a record it refuses before the
// connection closes.
func (p *polled) openDetached() readNext {
	w := p.tlsW
	next := readOn
	for next == readOn {
		rec, ok := p.wire.Next()
		if !ok {
			break
		}
		data, answer, err := p.rec.Open(rec)
		if answer {
			w.sealWith(w.rec.SealKeyUpdate)
		}
		if len(data) > 0 {
			next = p.consumePlain(data)
		}
		var alert tlswire.Alert
		switch {
		case err == nil:
		case errors.As(err, &alert):
			p.n.log.Debug("tls record refused", "remote", p.RemoteAddr().String(), "alert", uint8(alert))
			w.sealWith(func(dst []byte) []byte { return w.rec.SealAlert(dst, alert) })
			next = readClose
		default:
			next = readClose // the client's close_notify or alert
		}
	}
	w.dispatchSealed(false)
	return next
}

// consumePlain handles decrypted bytes, after the incomplete frame pending, if any.
func (p *polled) consumePlain(plain []byte) readNext {
	if p.pending != nil {
		p.pending = append(p.pending, plain...)
		plain = p.pending
	}
	return p.consume(plain)
}

// appendSealed takes a record crypto/tls sealed (tlswire.Wire's writes, with the tls.Conn's
// write lock held, so in the records' order) until a dispatch sends or queues it.
func (w *sockWriter) appendSealed(b []byte) {
	w.mu.Lock()
	w.sealed = append(w.sealed, b...)
	w.mu.Unlock()
}

// sendTLS seals one frame into a record and sends or queues it, as send does plain frames;
// after the last, the record layer seals a close_notify (crypto/tls, which cannot be asked for
// one without blocking on the socket, lets the close speak for itself).
func (w *sockWriter) sendTLS(op byte, b []byte, last bool) {
	w.mu.Lock()
	stop := w.closed || w.closeAfter
	w.mu.Unlock()
	if stop {
		return
	}
	bp := sealBufs.Get().(*[]byte)
	plain := append(w.header((*bp)[:0], op, len(b)), b...)
	ok := w.seal(plain)
	*bp = plain[:0]
	sealBufs.Put(bp)
	if !ok {
		w.forceClose()
		return
	}
	if last && w.rec != nil { // the node closes: say so, as RFC 8446 section 6.1 asks
		w.sealWith(func(dst []byte) []byte {
			w.closeAfter = true // the last record: dispatchSealed sends it and closes
			return w.rec.SealAlert(dst, tlswire.AlertCloseNotify)
		})
	}
	w.dispatchSealed(last)
}

// sealBufs hold a frame's plaintext (header and payload) while it is sealed.
var sealBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// dispatchSealed sends, or queues behind what is queued, every record sealed so far; last
// closes the connection once they are written. Whoever dispatches takes all the records sealed
// before, its own and perhaps another sender's, so the socket gets them in the order crypto/tls
// numbered them; a sender whose record another took has nothing left to send.
func (w *sockWriter) dispatchSealed(last bool) {
	w.mu.Lock()
	out := w.sealed
	w.sealed = nil
	if w.closed {
		w.mu.Unlock()
		return
	}
	if last {
		w.closeAfter = true
	}
	switch {
	case len(out) == 0:
		closeNow := w.closeAfter && !w.flushing && len(w.queue) == 0
		if closeNow {
			w.closed = true
		}
		w.mu.Unlock()
		if closeNow {
			_ = w.p.Close()
		}
		return
	case w.flushing || len(w.queue) > 0:
		w.enqueueLocked(nil, out)
		w.mu.Unlock()
		return
	}
	w.flushing = true
	w.mu.Unlock()
	n, err := netpoll.WritevNow(w.p.rc, nil, out)
	w.done(nil, out, n, err)
}

// claimSealed seals wire (a room's frames for this member) and claims the socket for a batch
// send of the record, which it returns; or, when the socket is busy, queues the record behind
// what is queued and returns false, as it does when the writer is closed.
func (w *sockWriter) claimSealed(wire []byte) ([]byte, bool) {
	w.mu.Lock()
	stop := w.closed || w.closeAfter
	w.mu.Unlock()
	if stop {
		return nil, false
	}
	if !w.seal(wire) {
		w.forceClose()
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.sealed
	w.sealed = nil
	switch {
	case w.closed || len(out) == 0: // closed, or another sender took the record with its own
		return nil, false
	case w.flushing || len(w.queue) > 0:
		w.enqueueLocked(nil, out)
		return nil, false
	}
	w.flushing = true
	return out, true
}
