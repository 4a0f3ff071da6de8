package chatlink

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lxzan/gws"

	"roomcast/chatlink/internal/tlswire"
	"roomcast/chatlink/internal/wsproto"
	"roomcast/proto/clientpb"
)

// wsPath is the path of the WebSocket endpoint.
const wsPath = "/v1/ws"

// wsHandler receives gws events for every WebSocket connection of a node.
type wsHandler struct{ n *Node }

var _ gws.Event = wsHandler{}

// wsSlot is the per-connection session storage gws asks for: just the conn, instead of gws's
// default map.
type wsSlot struct{ c *conn }

func (s *wsSlot) Len() int {
	if s.c == nil {
		return 0
	}
	return 1
}
func (s *wsSlot) Load(string) (any, bool)              { return s.c, s.c != nil }
func (s *wsSlot) Delete(string)                        { s.c = nil }
func (s *wsSlot) Store(_ string, v any)                { s.c, _ = v.(*conn) }
func (s *wsSlot) Range(f func(key string, v any) bool) { f("conn", s.c) }

func connOf(socket *gws.Conn) *conn { return socket.Session().(*wsSlot).c }

// OnOpen does nothing: serveWSReader registered the connection before its reader started.
func (h wsHandler) OnOpen(*gws.Conn) {}

func (h wsHandler) OnClose(socket *gws.Conn, err error) {
	defer h.n.wg.Done() // the reader started in serveWSReader ends here
	c := connOf(socket)
	if c == nil {
		return
	}
	// gws answers an oversize frame itself, with close code 1009; count it with ours.
	if sc, ok := err.(interface{ Uint16() uint16 }); ok && sc.Uint16() == 1009 && !c.closing.Load() {
		h.n.m.closes.WithLabelValues(clientpb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE.String()).Inc()
	}
	c.closed()
}

func (h wsHandler) OnPing(socket *gws.Conn, payload []byte) {
	if c := connOf(socket); c != nil {
		c.lastSeen.Store(h.n.now().UnixNano())
	}
	_ = socket.WritePong(payload)
}

func (h wsHandler) OnPong(*gws.Conn, []byte) {}

func (h wsHandler) OnMessage(socket *gws.Conn, msg *gws.Message) {
	defer msg.Close()
	c := connOf(socket)
	if msg.Opcode != gws.OpcodeBinary {
		h.n.m.frameBad.Inc()
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "frames are binary WebSocket messages")
		return
	}
	c.handle(msg.Bytes())
}

// wsHandshakeTimeout bounds reading a client's WebSocket upgrade request.
const wsHandshakeTimeout = 5 * time.Second

// acceptWS takes WebSocket connections. It reads the HTTP upgrade request itself, with the
// small buffer gws then keeps for the connection, instead of going through net/http: an
// http.Server would allocate 8 KiB of buffers and a goroutine per connection only to hand the
// socket over.
func (n *Node) acceptWS() {
	for {
		nc, err := n.wsLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			n.log.Warn("websocket accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		n.goAsync(func() { n.upgradeWS(nc) })
	}
}

// handshakeReaders read upgrade requests. A connection read by the poller gives its reader
// back after the upgrade; one with a reader goroutine keeps it for gws.
var handshakeReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, wsReadBuffer) }}

// upgradeWS upgrades one connection (GET /v1/ws), on a short-lived goroutine, and hands it to
// the node's poller (polled.go), or to a reader goroutine of its own without a poller. Over TLS
// the handshake comes first, on the same goroutine (transport_tls.go).
func (n *Node) upgradeWS(nc net.Conn) {
	sock, _ := nc.(*net.TCPConn)
	var overTLS *tls.Conn
	var wire *tlswire.Wire
	if n.cfg.TLS != nil {
		if overTLS, wire = n.handshakeTLS(nc); overTLS == nil {
			return
		}
		nc = overTLS // the upgrade is read and answered through TLS
	}
	_ = nc.SetDeadline(time.Now().Add(wsHandshakeTimeout))
	br := handshakeReaders.Get().(*bufio.Reader)
	br.Reset(nc)
	if isSSERequest(br) { // the HTTP fallback (transport_sse.go)
		n.sse.handOver(nc, br)
		br.Reset(nil)
		handshakeReaders.Put(br)
		return
	}
	req, err := wsproto.ReadUpgrade(br, wsPath)
	switch {
	case errors.Is(err, wsproto.ErrNotFound):
		_, _ = io.WriteString(nc, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = nc.Close()
		return
	case err != nil:
		n.handshakeFailed(nc, "websocket", err)
		_, _ = io.WriteString(nc, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = nc.Close()
		return
	}
	addr := n.limits.clientAddr(nc.RemoteAddr().String(), req.Header.Values("X-Forwarded-For"), req.Header.Get("X-Real-IP"))
	if code := n.limits.admit(addr); code != 0 {
		n.m.closes.WithLabelValues(code.String()).Inc()
		_, _ = io.WriteString(nc, refusalResponse(code))
		_ = nc.Close()
		return
	}
	if n.poll == nil || sock == nil {
		if overTLS != nil {
			n.m.tlsSessions.WithLabelValues("crypto_tls").Inc()
		}
		n.serveWSReader(nc, br, req, addr) // gws keeps br
		return
	}
	// Read by the poller. gws gets no reader: it answers the upgrade, and writes only where
	// the node has no io_uring rings (and never over TLS: the node seals and writes).
	p, err := newPolled(n, sock)
	if err != nil {
		n.limits.closed(addr)
		_ = nc.Close()
		return
	}
	var early []byte
	if k := br.Buffered(); k > 0 { // frames the client sent right behind its request
		b, _ := br.Peek(k)
		early = append([]byte(nil), b...)
	}
	br.Reset(nil)
	handshakeReaders.Put(br)
	var up net.Conn = p
	if overTLS != nil {
		up = overTLS
	}
	socket, err := n.upgrader.UpgradeFromConn(up, nil, req)
	if err != nil {
		n.limits.closed(addr)
		return // gws has answered 400 and closed
	}
	_ = nc.SetDeadline(time.Time{})
	f := &wsFrames{p: p, r: wsproto.Reader{Max: n.cfg.MaxFrameBytes}}
	p.feed = f.feed
	switch {
	case overTLS != nil:
		f.w = newSockWriter(p, true)
		p.overTLS(overTLS, wire, f.w) // before the conn is in the node's table, for the sweep
		p.c = n.newConn(f.w, addr)
	case n.rings != nil:
		// The node writes the frames itself (sockWriter, batch.go): gws's connection, which
		// only answered the upgrade, is not kept.
		f.w = newSockWriter(p, true)
		p.c = n.newConn(f.w, addr)
	default:
		f.s = socket
		p.c = n.newConn(&wsTransport{s: socket}, addr)
	}
	p.start(early)
}

// refusalResponse is the HTTP answer to an upgrade refused by admit: 403 for a denied
// address, 429 (with Retry-After) for one with too many connections, with the close code in
// a header.
func refusalResponse(code clientpb.CloseCode) string {
	status := "403 Forbidden"
	if code == clientpb.CloseCode_CLOSE_CODE_TOO_MANY_CONNECTIONS {
		status = "429 Too Many Requests\r\nRetry-After: " + strconv.Itoa(int(connsRetryHint/time.Second))
	}
	return "HTTP/1.1 " + status + "\r\nRoomcast-Close-Code: " + strconv.Itoa(int(code)) + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
}

// serveWSReader upgrades a connection that gets a reader goroutine of its own
// (Config.ReaderGoroutines, no poller on this platform, or TLS).
func (n *Node) serveWSReader(nc net.Conn, br *bufio.Reader, req *http.Request, addr netip.Addr) {
	socket, err := n.upgrader.UpgradeFromConn(nc, br, req)
	if err != nil {
		n.limits.closed(addr)
		return // gws has answered 400 and closed
	}
	_ = nc.SetDeadline(time.Time{})
	socket.Session().(*wsSlot).c = n.newConn(&wsTransport{s: socket}, addr)
	// Not n.goAsync: a wrapper frame is enough to push the reader's parked stack past 2 KiB,
	// and it would then hold 4 KiB for the connection's life. OnClose, the last thing the
	// reader runs, tells n.wg it is done.
	n.wg.Add(1)
	go socket.ReadLoop()
}

// wsTransport writes frames to a gws connection. gws queues asynchronous writes per
// connection without a limit, so a write never blocks the fan-out, and the backlog is counted
// here.
type wsTransport struct {
	s       *gws.Conn
	backlog atomic.Int64
}

func (t *wsTransport) write(b []byte) {
	n := int64(len(b))
	t.backlog.Add(n)
	t.s.WriteAsync(gws.OpcodeBinary, b, func(error) { t.backlog.Add(-n) })
}

func (t *wsTransport) pending() int64 { return t.backlog.Load() }

func (t *wsTransport) kick(code clientpb.CloseCode, kick []byte) {
	t.s.Async(func() {
		_ = t.s.WriteMessage(gws.OpcodeBinary, kick)
		_ = t.s.WriteClose(uint16(code), []byte(code.String()))
	})
}

func (t *wsTransport) forceClose() { _ = t.s.NetConn().Close() }
