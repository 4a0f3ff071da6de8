package chatlink

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/clientip"
	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
)

// writeTimeout bounds one flush to a TCP client; a client that takes longer is closed.
const writeTimeout = 10 * time.Second

// startPolledTCP serves a length-prefixed TCP connection read by the node's poller.
func (n *Node) startPolledTCP(tc *net.TCPConn) {
	p, err := newPolled(n, tc)
	if err != nil {
		n.limits.closed(peerAddr(tc))
		_ = tc.Close()
		return
	}
	p.feed = p.tcpFeed
	if n.rings != nil {
		p.c = n.newConn(newSockWriter(p, false), peerAddr(tc)) // the node's batch sends (batch.go)
	} else {
		p.c = n.newConn(&tcpTransport{n: n, nc: p}, peerAddr(tc))
	}
	p.start(nil)
}

// peerAddr is a connection's peer address: TCP clients are not behind HTTP proxies.
func peerAddr(nc net.Conn) netip.Addr {
	a, _ := clientip.ParseHostAddr(nc.RemoteAddr().String())
	return a
}

// admitTCP refuses a connection whose address is denied or has too many connections open:
// a plain one gets a Kick with the close code, one over TLS is closed without a word.
func (n *Node) admitTCP(nc net.Conn) bool {
	code := n.limits.admit(peerAddr(nc))
	if code == 0 {
		return true
	}
	if n.cfg.TLS == nil {
		k := &clientpb.Kick{Code: uint32(code), Reason: code.String()}
		if code == clientpb.CloseCode_CLOSE_CODE_TOO_MANY_CONNECTIONS {
			k.RetryAfterMs = ratelimit.Millis(connsRetryHint)
		}
		b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Kick{Kick: k}})
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = nc.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
		_, _ = nc.Write(b)
	}
	n.m.closes.WithLabelValues(code.String()).Inc()
	_ = nc.Close()
	return false
}

// serveTCP runs one length-prefixed TCP connection: it reads frames until the connection ends.
func (n *Node) serveTCP(nc net.Conn) {
	defer n.wg.Done()
	_, overTLS := nc.(*tls.Conn)
	t := &tcpTransport{n: n, nc: nc, oneWrite: overTLS}
	c := n.newConn(t, peerAddr(nc))
	defer c.closed()
	defer t.forceClose()
	br := bufio.NewReaderSize(nc, wsReadBuffer)
	var hdr [4]byte
	for !c.closing.Load() {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[:])
		if c.refuseTCPLength(size) {
			t.waitFlushed()
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(br, buf); err != nil {
			return
		}
		c.handle(buf)
	}
	t.waitFlushed()
}

// refuseTCPLength closes the connection, with a Kick, when a TCP frame's length prefix is
// zero or over the limit, and reports whether it did. The node refuses such a frame without
// reading (or buffering) what it announces.
func (c *conn) refuseTCPLength(size uint32) bool {
	code, reason := clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "empty frame"
	switch {
	case size > uint32(c.node.cfg.MaxFrameBytes):
		code, reason = clientpb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE, "frame too large"
	case size != 0:
		return false
	}
	c.node.m.frameBad.Inc()
	c.close(code, reason)
	return true
}

// tcpTransport queues frames for one TCP connection and writes them, length-prefixed, from a
// goroutine that runs only while there is something to write.
type tcpTransport struct {
	n  *Node
	nc net.Conn
	// oneWrite makes each flush one write of one buffer: over TLS every write is at least one
	// record, and a record per frame and per length prefix would multiply the overhead.
	oneWrite bool

	mu      sync.Mutex // guards the fields below
	queue   [][]byte
	writing bool // a flush goroutine is running
	closing bool // close after the queue is written
	closed  bool
	flushed chan struct{} // closed when the closing flush is done

	backlog atomic.Int64 // bytes queued or being written
}

func (t *tcpTransport) pending() int64 { return t.backlog.Load() }

func (t *tcpTransport) write(b []byte) {
	t.mu.Lock()
	if t.closing || t.closed {
		t.mu.Unlock()
		return
	}
	t.enqueueLocked(b)
	t.mu.Unlock()
}

// enqueueLocked adds b to the queue and starts a flush if none runs. Caller holds t.mu.
func (t *tcpTransport) enqueueLocked(b []byte) {
	t.queue = append(t.queue, b)
	t.backlog.Add(int64(len(b)))
	if !t.writing {
		t.writing = true
		t.n.goAsync(t.flush)
	}
}

func (t *tcpTransport) kick(_ clientpb.CloseCode, kick []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing || t.closed {
		return
	}
	t.closing = true
	t.flushed = make(chan struct{})
	t.enqueueLocked(kick)
}

// waitFlushed waits (bounded by the write timeout) for a Kick to be written, so the read loop
// does not close the socket under it.
func (t *tcpTransport) waitFlushed() {
	t.mu.Lock()
	ch := t.flushed
	t.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-time.After(writeTimeout):
	}
}

func (t *tcpTransport) flush() {
	var hdrs, joined []byte
	var bufs net.Buffers
	for {
		t.mu.Lock()
		q := t.queue
		t.queue = nil
		if len(q) == 0 || t.closed {
			t.writing = false
			if t.closing && t.flushed != nil {
				close(t.flushed)
				t.flushed = nil
				t.closed = true
				_ = t.nc.Close()
			}
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()

		hdrs = hdrs[:0]
		for _, b := range q {
			hdrs = binary.BigEndian.AppendUint32(hdrs, uint32(len(b)))
		}
		bufs = bufs[:0]
		for i, b := range q {
			bufs = append(bufs, hdrs[i*4:i*4+4], b)
		}
		var size int64
		for _, b := range q {
			size += int64(len(b))
		}
		if t.oneWrite {
			joined = joined[:0]
			for _, b := range bufs {
				joined = append(joined, b...)
			}
			bufs = append(bufs[:0], joined)
		}
		_ = t.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := bufs.WriteTo(t.nc)
		t.backlog.Add(-size)
		if err != nil {
			t.forceClose()
		}
	}
}

func (t *tcpTransport) forceClose() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	t.queue = nil
	if t.flushed != nil {
		close(t.flushed)
		t.flushed = nil
	}
	_ = t.nc.Close()
}
