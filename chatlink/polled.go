package chatlink

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/lxzan/gws"

	"roomcast/chatlink/internal/tlswire"
	"roomcast/chatlink/internal/wsproto"
	"roomcast/internal/netpoll"
	"roomcast/proto/clientpb"
)

// polled is a client connection whose frames the node reads when its poller says the socket
// is readable, on a short-lived goroutine, instead of on a reader goroutine that lives as long
// as the connection (netpoll). It stands in for the socket inside the transport (gws
// for WebSocket, tcpTransport for TCP), so that every close, whichever side makes it (a kick,
// a failed write, the node), reaches the node exactly once, after any read in progress.
type polled struct {
	*net.TCPConn
	n  *Node
	c  *conn
	rc syscall.RawConn
	fd int32  // the descriptor, valid until the socket is closed (closeSocket)
	id uint64 // the poller registration

	// sockMu is held for reading while a batch send (ring) uses fd, and for writing while the
	// socket is closed, so the batch never sends to a descriptor that was closed, and perhaps
	// reused by a new connection, under it. sockClosed is guarded by it.
	sockMu     sync.RWMutex
	sockClosed bool

	// feed handles the complete frames at the start of data (the transport's framing) and
	// returns how many bytes it consumed, how many the next frame needs in all if it is
	// incomplete, and what to do next.
	feed func(data []byte) (consumed, need int, next readNext)

	// Touched only by the one read in progress.
	registered bool   // added to the poller
	pending    []byte // an incomplete frame

	// Set for a TLS connection (overTLS, transport_tls.go): the socket's bytes go to wire, and
	// the frames are read from rec, the record layer taken over from crypto/tls, or from tls
	// where it could not be; tlsW writes.
	tls  *tls.Conn
	rec  *tlswire.Session
	wire *tlswire.Wire
	tlsW *sockWriter

	mu      sync.Mutex // guards the fields below
	reading bool       // a read is in progress; it finishes the connection if it died meanwhile
	dead    bool       // closed; finish has run or will run once
}

// readNext says what a read leads to.
type readNext int

const (
	readOn      readNext = iota // arm the socket for the next read
	readClose                   // close the connection now (end of stream, a protocol error)
	readStopped                 // read no more; the transport is closing the connection
)

// readBufs are the buffers reads go into when no frame is pending.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

func newPolled(n *Node, tc *net.TCPConn) (*polled, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		return nil, err
	}
	// reading until start: a close before the conn exists must not finish it.
	return &polled{TCPConn: tc, n: n, rc: rc, fd: int32(fd), id: n.poll.NewID(), reading: true}, nil
}

// closeSocket closes the socket once no batch send is using its descriptor.
func (p *polled) closeSocket() error {
	p.sockMu.Lock()
	defer p.sockMu.Unlock()
	p.sockClosed = true
	return p.TCPConn.Close()
}

// lockFD returns the descriptor for a batch send and holds it open until unlockFD; ok is
// false when the socket is closed or being closed. It never waits, so batches that share
// members cannot hold each other up behind a close.
func (p *polled) lockFD() (fd int32, ok bool) {
	if !p.sockMu.TryRLock() {
		return -1, false
	}
	if p.sockClosed {
		p.sockMu.RUnlock()
		return -1, false
	}
	return p.fd, true
}

func (p *polled) unlockFD() { p.sockMu.RUnlock() }

// Write writes b: what the socket takes at once with a raw call (netpoll.WritevNow), the rest
// through the runtime's poller. gws writes the upgrade's answer with it, and every frame where
// the node has no io_uring rings.
func (p *polled) Write(b []byte) (int, error) {
	n, err := netpoll.WritevNow(p.rc, nil, b)
	if err != nil || n == len(b) {
		return n, err
	}
	m, err := p.TCPConn.Write(b[n:])
	return n + m, err
}

// Close closes the socket (the transport calls it too). The connection is finished at once,
// or by the read in progress when it ends.
func (p *polled) Close() error {
	err := p.closeSocket()
	p.mu.Lock()
	finishNow := !p.dead && !p.reading
	p.dead = true
	p.mu.Unlock()
	if finishNow {
		go p.finish() // not inline: the caller may hold locks the node's close path takes
	}
	return err
}

// finish tells the node the connection is gone. It runs exactly once.
func (p *polled) finish() {
	p.n.poll.Remove(p.id)
	p.c.closed()
	p.n.wg.Done()
}

// start serves a connection once p.c and p.feed are set: early holds bytes the client sent
// before (behind its upgrade request), if any.
func (p *polled) start(early []byte) {
	p.n.wg.Add(1) // finish tells n.wg when the connection is gone
	next := readOn
	if len(early) > 0 {
		next = p.consume(early)
	}
	if next == readOn && p.wire != nil { // records the client sent behind its handshake
		next = p.openRecords()
		p.settleTLS()
	}
	p.done(next)
}

// readSoon runs on the poller's goroutine when the socket is readable, and hands the read to
// a goroutine of its own: a read handles the client's frames, which may wait (a full queue, a
// lock), and the poller must not. An idle reader takes it if one waits, else a new one starts.
func (p *polled) readSoon() {
	select {
	case p.n.readers <- p:
	default:
		go p.n.reader(p)
	}
}

// readerIdle is how long a reader waits for another connection's read before it ends.
const readerIdle = time.Second

// reader reads for p, then for the connections handed to it on n.readers, until none comes for
// readerIdle or the node stops. A goroutine started afresh for every read (a member's send is
// often one read) starts on a small stack and grows it, copying, on the way down through the
// frame's handling: a reader kept for the next read has grown it once. The readers idle at a
// time are the most reads there were at once within readerIdle, not one a connection.
func (n *Node) reader(p *polled) {
	idle := time.NewTimer(readerIdle)
	defer idle.Stop()
	for {
		p.readable()
		idle.Reset(readerIdle)
		select {
		case p = <-n.readers:
		case <-idle.C:
			return
		case <-n.ctx.Done():
			return
		}
	}
}

// readable reads, on a goroutine of its own.
func (p *polled) readable() {
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return
	}
	p.reading = true
	p.mu.Unlock()
	p.done(p.read())
}

// done ends a read.
func (p *polled) done(next readNext) {
	p.mu.Lock()
	if p.dead || next == readClose {
		p.dead, p.reading = true, false
		p.mu.Unlock()
		_ = p.closeSocket()
		p.finish()
		return
	}
	p.reading = false
	p.mu.Unlock()
	if next == readStopped {
		return // the transport's close finishes the connection
	}
	// Armed after reading is cleared: the next event may start the next read at once.
	var err error
	if !p.registered {
		p.registered = true
		err = p.n.poll.Add(p.rc, p.id, p.readSoon, netpoll.OneShot)
	} else {
		err = p.n.poll.Arm(p.rc, p.id)
	}
	if err != nil {
		_ = p.Close() // closed meanwhile (then this does nothing), or the poller refused it
	}
}

// read reads what the socket has and handles the complete frames in it.
func (p *polled) read() readNext {
	if p.wire != nil {
		return p.readTLS()
	}
	var buf []byte // read into buf[len(buf):cap(buf)]
	if p.pending != nil {
		if len(p.pending) == cap(p.pending) { // consume leaves room; never read into nothing
			p.pending = slices.Grow(p.pending, pendingMin)
		}
		buf = p.pending
	} else {
		bp := readBufs.Get().(*[]byte)
		defer readBufs.Put(bp)
		buf = (*bp)[:0]
	}
	n, eof, err := netpoll.ReadNow(p.rc, buf[len(buf):cap(buf)])
	if err != nil || eof {
		return readClose
	}
	return p.consume(buf[:len(buf)+n])
}

// consume handles the complete frames in data and keeps an incomplete one for the next read.
func (p *polled) consume(data []byte) readNext {
	if len(data) == 0 {
		return readOn
	}
	consumed, need, next := p.feed(data)
	if next != readOn {
		return next
	}
	rest := data[consumed:]
	switch {
	case len(rest) == 0:
		p.pending = nil
	case consumed == 0 && p.pending != nil && cap(p.pending) >= need:
		p.pending = rest // the pending frame grew; its buffer still fits
	default:
		// Grow with what has arrived, not with what the header announces: a client that
		// announces a large frame and trickles it in holds only about twice what it sent.
		buf := make([]byte, len(rest), max(min(need, 2*len(rest)), len(rest), pendingMin))
		copy(buf, rest)
		p.pending = buf
	}
	return readOn
}

// pendingMin is the smallest buffer kept for an incomplete frame: room for any frame header.
const pendingMin = 64

// wsFrames reads WebSocket frames for a polled connection; w writes.
type wsFrames struct {
	p    *polled
	w    *sockWriter // the node writes (batch sends); or else
	s    *gws.Conn   // gws writes (Config.PlainWrites, or no io_uring)
	r    wsproto.Reader
	stop bool // a close frame came
}

var _ wsproto.Handler = (*wsFrames)(nil)

// closeWith sends a close frame and returns what the read is to do next.
func (w *wsFrames) closeWith(code uint16, reason string) readNext {
	if w.w == nil {
		// Queued behind the frames already queued (answers to the client's last frames),
		// as the node's own writer does; gws closes the socket once it is written.
		w.s.Async(func() { _ = w.s.WriteClose(code, []byte(reason)) })
		return readStopped
	}
	w.w.closeWith(code, reason)
	return readStopped // the writer closes once the close frame is out
}

func (w *wsFrames) pong(payload []byte) {
	if w.w == nil {
		w.s.WriteAsync(gws.OpcodePong, payload, nil)
		return
	}
	w.w.pong(payload)
}

func (w *wsFrames) feed(data []byte) (int, int, readNext) {
	consumed, need, werr := w.r.Parse(data, w)
	switch {
	case werr != nil:
		if werr.Code == 1009 && !w.p.c.closing.Load() {
			w.p.n.m.closes.WithLabelValues(clientpb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE.String()).Inc()
		} else {
			w.p.n.m.frameBad.Inc()
		}
		return consumed, 0, w.closeWith(werr.Code, werr.Reason)
	case w.stop:
		return consumed, 0, readStopped // the writer closes once the close frame is out
	}
	return consumed, need, readOn
}

// Message is a complete message from the client.
func (w *wsFrames) Message(op byte, payload []byte) {
	if op != wsproto.OpBinary {
		w.p.n.m.frameBad.Inc()
		w.p.c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "frames are binary WebSocket messages")
		return
	}
	w.p.c.handleFrame(payload)
}

// Control answers a ping and a close.
func (w *wsFrames) Control(op byte, payload []byte) {
	switch op {
	case wsproto.OpPing:
		w.p.c.lastSeen.Store(w.p.n.now().UnixNano())
		w.pong(append([]byte(nil), payload...))
	case wsproto.OpClose:
		// Echo the client's code, as RFC 6455 asks, unless it is not one a peer may send.
		code := uint16(1000)
		if len(payload) >= 2 {
			code = binary.BigEndian.Uint16(payload)
			if !wsproto.ValidCloseCode(code) {
				code = 1002
			}
		} else if len(payload) == 1 {
			code = 1002
		}
		w.closeWith(code, "")
		w.stop = true
	}
}

// tcpFeed reads length-prefixed frames (a 4-byte big-endian length, then the Frame) for a
// polled TCP connection. A bad length gets a Kick; the transport closes the connection once
// the Kick is written.
func (p *polled) tcpFeed(data []byte) (int, int, readNext) {
	return tcpFrames(data, p.c.refuseTCPLength, p.c.handleFrame)
}

// tcpFrames hands each complete length-prefixed frame at the start of data to frame, and
// returns how many bytes it consumed and, when the frame after those is incomplete, how many
// that one needs in all. It reads no length that refuse refuses (it closes the connection)
// any further, and stops there.
func tcpFrames(data []byte, refuse func(size uint32) bool, frame func([]byte)) (int, int, readNext) {
	consumed := 0
	for {
		rest := data[consumed:]
		if len(rest) < 4 {
			return consumed, 4, readOn
		}
		size := binary.BigEndian.Uint32(rest)
		if refuse(size) {
			return consumed, 0, readStopped
		}
		total := 4 + int(size)
		if len(rest) < total {
			return consumed, total, readOn
		}
		consumed += total
		frame(rest[4:total])
	}
}
