package chatlink

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"roomcast/chatlink/internal/tlswire"
	"roomcast/chatlink/internal/wsproto"
	"roomcast/internal/netpoll"
	"roomcast/proto/clientpb"
)

// sockWriter writes a polled connection's frames (polled.go) without ever blocking its
// caller, and without a goroutine per write. A room's write claims the socket and sends the
// frame in a batch with other members' (claim, sent; batch.go); any other frame, while nothing
// is queued, goes straight to the socket from the caller's goroutine as one non-blocking
// writev. Whatever the socket does not take is queued, and a flusher goroutine, running only
// while the queue is not empty, writes it with ordinary (waiting) writes. The queued bytes are
// the connection's backlog, which flow control reads (pending). It frames WebSocket (server
// frames: unmasked, FIN set) or length-prefixed TCP.
type sockWriter struct {
	p  *polled
	ws bool // WebSocket framing, else length-prefixed TCP
	// rec, or tls where crypto/tls kept the connection, seals the frames of a TLS connection
	// into records (transport_tls.go); both nil for a plain one. Set before the connection is
	// shared; rec is used under mu.
	tls *tls.Conn
	rec *tlswire.Session

	mu         sync.Mutex // guards the fields below
	queue      net.Buffers
	flushing   bool // a write owns the socket: inline, a batch's claim, or the flusher
	closeAfter bool // close the socket once the queue is written (a kick)
	closed     bool
	sealed     []byte // records sealed, not yet sent or queued (dispatchSealed)

	backlog atomic.Int64 // bytes queued, not yet taken by the socket
}

// Frame kinds for send; TCP framing has no kinds and ignores them.
const (
	opData  = wsproto.OpBinary
	opClose = wsproto.OpClose
	opPong  = wsproto.OpPong
)

func newSockWriter(p *polled, ws bool) *sockWriter { return &sockWriter{p: p, ws: ws} }

// header appends the header of a frame of n bytes.
func (w *sockWriter) header(hdr []byte, op byte, n int) []byte {
	if w.ws {
		return wsproto.AppendHeader(hdr, op, n)
	}
	return tcpWire(hdr, n)
}

// tcpWire appends the length prefix of a TCP frame of n bytes.
func tcpWire(hdr []byte, n int) []byte { return binary.BigEndian.AppendUint32(hdr, uint32(n)) }

func (w *sockWriter) write(b []byte) { w.send(opData, b, false) }

func (w *sockWriter) pending() int64 { return w.backlog.Load() }

// kick sends the Kick frame (and over WebSocket a close frame with code), then closes the
// connection once they are written.
func (w *sockWriter) kick(code clientpb.CloseCode, kick []byte) {
	if w.ws {
		w.send(opData, kick, false)
		reason := code.String()
		w.send(opClose, append(binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reason)), uint16(code)), reason...), true)
		return
	}
	w.send(opData, kick, true)
}

// closeWith sends a WebSocket close frame with code and closes once it is written.
func (w *sockWriter) closeWith(code uint16, reason string) {
	w.send(opClose, append(binary.BigEndian.AppendUint16(nil, code), reason...), true)
}

func (w *sockWriter) pong(payload []byte) { w.send(opPong, payload, false) }

// forceClose closes the connection at once, dropping what is queued.
func (w *sockWriter) forceClose() {
	w.mu.Lock()
	w.closed, w.closeAfter = true, false
	w.backlog.Add(-int64(bufLen(w.queue)))
	w.queue = nil
	w.mu.Unlock()
	_ = w.p.Close()
}

// send writes one frame of payload b; last closes the connection after it. b is not changed
// and may be shared with other connections.
func (w *sockWriter) send(op byte, b []byte, last bool) {
	if w.sealing() {
		w.sendTLS(op, b, last)
		return
	}
	var hdrBuf [14]byte
	hdr := w.header(hdrBuf[:0], op, len(b))
	w.mu.Lock()
	if w.closed || w.closeAfter {
		w.mu.Unlock()
		return
	}
	w.closeAfter = last
	if w.flushing || len(w.queue) > 0 {
		w.enqueueLocked(append([]byte(nil), hdr...), b)
		w.mu.Unlock()
		return
	}
	w.flushing = true // the socket is this goroutine's until done clears the flag
	w.mu.Unlock()

	n, err := netpoll.WritevNow(w.p.rc, hdr, b)
	w.done(hdr, b, n, err)
}

// claim takes the socket for a batch send (batch.go) and reports whether it did: not when the
// writer is closed or closing, or has frames queued or a write in progress (then the frame
// goes through write, behind them). A claim ends with sent.
func (w *sockWriter) claim() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.closeAfter || w.flushing || len(w.queue) > 0 {
		return false
	}
	w.flushing = true
	return true
}

// sent ends a claimed send of wire, a whole frame: the socket took n bytes of it, or err.
func (w *sockWriter) sent(wire []byte, n int, err error) { w.done(nil, wire, n, err) }

// done ends a write of hdr then b made while w.flushing was set: the socket took n bytes of
// them, or err. The rest, and whatever was queued meanwhile, goes to the flusher.
func (w *sockWriter) done(hdr, b []byte, n int, err error) {
	w.mu.Lock()
	if w.closed { // forceClose ran meanwhile, and closes the socket
		w.flushing = false
		w.mu.Unlock()
		return
	}
	switch {
	case err != nil:
		w.flushing = false
		w.mu.Unlock()
		w.forceClose()
		return
	case n < len(hdr)+len(b):
		// The socket took part of it: the rest goes first, ahead of anything queued
		// meanwhile.
		var rest net.Buffers
		if n < len(hdr) {
			rest = append(rest, append([]byte(nil), hdr[n:]...), b)
		} else {
			rest = append(rest, b[n-len(hdr):])
		}
		w.backlog.Add(int64(bufLen(rest)))
		w.queue = append(rest, w.queue...)
		w.mu.Unlock()
		go w.flush()
		return
	}
	if len(w.queue) > 0 {
		// Others queued behind this write meanwhile: they are the flusher's now.
		w.mu.Unlock()
		go w.flush()
		return
	}
	w.flushing = false
	closeNow := w.closeAfter
	if closeNow {
		w.closed = true
	}
	w.mu.Unlock()
	if closeNow {
		_ = w.p.Close()
	}
}

func (w *sockWriter) enqueueLocked(hdr, b []byte) {
	if len(hdr) > 0 {
		w.queue = append(w.queue, hdr)
	}
	w.queue = append(w.queue, b)
	w.backlog.Add(int64(len(hdr) + len(b)))
}

// flush writes the queue until it is empty, then closes the socket if a kick asked for it.
// It runs while w.flushing is set.
func (w *sockWriter) flush() {
	for {
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		if len(q) == 0 || w.closed {
			w.flushing = false
			closeNow := w.closeAfter && !w.closed
			if closeNow {
				w.closed = true
			}
			w.mu.Unlock()
			if closeNow {
				_ = w.p.Close()
			}
			return
		}
		w.mu.Unlock()
		size := int64(bufLen(q))
		_ = w.p.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := q.WriteTo(w.p.TCPConn)
		// The deadline is the flusher's alone: left set, it would fail the next inline write
		// once it passed.
		_ = w.p.SetWriteDeadline(time.Time{})
		w.backlog.Add(-size)
		if err != nil {
			w.mu.Lock()
			w.flushing = false
			w.mu.Unlock()
			w.forceClose()
			return
		}
	}
}

func bufLen(q net.Buffers) int {
	n := 0
	for _, b := range q {
		n += len(b)
	}
	return n
}
