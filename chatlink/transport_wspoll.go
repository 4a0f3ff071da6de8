package chatlink

import (
	"encoding/binary"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/lxzan/gws"

	pb "roomcast/proto/roomcastpb"
)

// wsPolled is a WebSocket connection whose frames the node reads when its poller says the
// socket is readable, on a short-lived goroutine, instead of on a reader goroutine that
// lives as long as the connection (poll_linux.go). gws performs the upgrade and all writes;
// wsPolled stands in for the socket inside gws, so that every close, whether gws's (a kick,
// a failed write) or the node's, reaches the node exactly once.
type wsPolled struct {
	*net.TCPConn
	n  *Node
	c  *conn
	s  *gws.Conn
	rc syscall.RawConn
	id uint64 // the poller registration

	registered bool // added to the poller; touched by the read in progress only

	// Touched only by the one read in progress.
	r       wsReader
	pending []byte // an incomplete frame, sized for all of it once its header is in
	stop    bool   // a close frame came, or the frames broke the protocol

	mu      sync.Mutex // guards the fields below
	reading bool       // a read is in progress; it finishes the connection if it died meanwhile
	dead    bool       // closed; finish has run or will run once
}

// readBufs are the buffers reads go into when no frame is pending.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// Close closes the socket (gws calls it too). The connection is finished at once, or by the
// read in progress when it ends.
func (p *wsPolled) Close() error {
	err := p.TCPConn.Close()
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
func (p *wsPolled) finish() {
	p.n.poll.remove(p.id)
	p.c.closed()
	p.n.wg.Done()
}

// start serves a freshly upgraded connection: early holds bytes the client sent behind its
// upgrade request, if any.
func (p *wsPolled) start(early []byte) {
	p.mu.Lock()
	p.reading = true
	p.mu.Unlock()
	ok := true
	if len(early) > 0 {
		ok = p.consume(early)
	}
	p.done(ok)
}

// readable runs on a goroutine of its own when the poller reports the socket readable.
func (p *wsPolled) readable() {
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return
	}
	p.reading = true
	p.mu.Unlock()
	p.done(p.read())
}

// done ends a read: it arms the socket for the next one if ok, else closes the connection.
func (p *wsPolled) done(ok bool) {
	p.mu.Lock()
	if ok && !p.dead {
		p.reading = false
		p.mu.Unlock()
		// Armed after reading is cleared: the next event may start the next read at once.
		var err error
		if !p.registered {
			p.registered = true
			err = p.n.poll.add(p.rc, p.id, p.readable)
		} else {
			err = p.n.poll.arm(p.rc, p.id)
		}
		if err != nil {
			_ = p.Close() // closed meanwhile (then this does nothing), or the poller refused it
		}
		return
	}
	p.dead, p.reading = true, false
	p.mu.Unlock()
	_ = p.TCPConn.Close()
	p.finish()
}

// read reads what the socket has and handles the complete frames in it. It reports false
// when the connection is to end.
func (p *wsPolled) read() bool {
	if p.pending != nil {
		n, eof, err := readRaw(p.rc, p.pending[len(p.pending):cap(p.pending)])
		if err != nil || eof {
			return false
		}
		return p.consume(p.pending[:len(p.pending)+n])
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	n, eof, err := readRaw(p.rc, *bp)
	if err != nil || eof {
		return false
	}
	return p.consume((*bp)[:n])
}

// consume handles the complete frames in data and keeps an incomplete one for the next read.
func (p *wsPolled) consume(data []byte) bool {
	if len(data) == 0 {
		return true
	}
	consumed, need, werr := p.r.parse(data, p)
	if werr != nil {
		if werr.code == 1009 && !p.c.closing.Load() {
			p.n.m.closes.WithLabelValues(pb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE.String()).Inc()
		} else {
			p.n.m.framesIn.WithLabelValues("bad").Inc()
		}
		_ = p.s.WriteClose(werr.code, []byte(werr.reason))
		return false
	}
	if p.stop {
		return false
	}
	rest := data[consumed:]
	switch {
	case len(rest) == 0:
		p.pending = nil
	case consumed == 0 && p.pending != nil && cap(p.pending) >= need:
		p.pending = rest // the pending frame grew; its buffer still fits
	default:
		buf := make([]byte, len(rest), max(need, len(rest)))
		copy(buf, rest)
		p.pending = buf
	}
	return true
}

// message is a complete message from the client (wsFrameHandler).
func (p *wsPolled) message(op byte, payload []byte) {
	if op != wsBinary {
		p.n.m.framesIn.WithLabelValues("bad").Inc()
		p.c.close(pb.CloseCode_CLOSE_CODE_BAD_FRAME, "frames are binary WebSocket messages")
		return
	}
	p.c.handleFrame(payload)
}

// control answers a ping and a close (wsFrameHandler).
func (p *wsPolled) control(op byte, payload []byte) {
	switch op {
	case wsPing:
		p.c.lastSeen.Store(time.Now().UnixNano())
		p.s.WriteAsync(gws.OpcodePong, append([]byte(nil), payload...), nil)
	case wsClose:
		// Echo the client's code, as RFC 6455 asks, unless it is not one a peer may send.
		code := uint16(1000)
		if len(payload) >= 2 {
			code = binary.BigEndian.Uint16(payload)
			if !validCloseCode(code) {
				code = 1002
			}
		} else if len(payload) == 1 {
			code = 1002
		}
		_ = p.s.WriteClose(code, nil)
		p.stop = true
	}
}

// validCloseCode reports whether a peer may send code in a close frame (RFC 6455 7.4).
func validCloseCode(code uint16) bool {
	switch {
	case code >= 3000 && code < 5000:
		return true
	case code < 1000 || code > 1014:
		return false
	}
	return code != 1004 && code != 1005 && code != 1006
}
