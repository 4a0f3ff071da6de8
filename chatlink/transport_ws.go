package chatlink

import (
	"net/http"
	"sync/atomic"

	"github.com/lxzan/gws"

	pb "roomcast/proto/roomcastpb"
)

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

func (h wsHandler) OnOpen(socket *gws.Conn) {
	socket.Session().(*wsSlot).c = h.n.newConn(&wsTransport{s: socket})
}

func (h wsHandler) OnClose(socket *gws.Conn, err error) {
	c := connOf(socket)
	if c == nil {
		return
	}
	// gws answers an oversize frame itself, with close code 1009; count it with ours.
	if sc, ok := err.(interface{ Uint16() uint16 }); ok && sc.Uint16() == 1009 && !c.closing.Load() {
		h.n.m.closes.WithLabelValues(pb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE.String()).Inc()
	}
	c.closed()
}

func (h wsHandler) OnPing(socket *gws.Conn, payload []byte) {
	if c := connOf(socket); c != nil {
		c.lastSeen.Store(nowNano())
	}
	_ = socket.WritePong(payload)
}

func (h wsHandler) OnPong(*gws.Conn, []byte) {}

func (h wsHandler) OnMessage(socket *gws.Conn, msg *gws.Message) {
	defer msg.Close()
	c := connOf(socket)
	if msg.Opcode != gws.OpcodeBinary {
		h.n.m.framesIn.WithLabelValues("bad").Inc()
		c.close(pb.CloseCode_CLOSE_CODE_BAD_FRAME, "frames are binary WebSocket messages")
		return
	}
	c.handle(msg.Bytes())
}

// serveWS upgrades an HTTP request on /v1/ws and runs the connection's read loop.
func (n *Node) serveWS(w http.ResponseWriter, r *http.Request) {
	socket, err := n.upgrader.Upgrade(w, r)
	if err != nil {
		return // gws has answered the request
	}
	n.goAsync(socket.ReadLoop)
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

func (t *wsTransport) kick(code pb.CloseCode, kick []byte) {
	t.s.Async(func() {
		_ = t.s.WriteMessage(gws.OpcodeBinary, kick)
		_ = t.s.WriteClose(uint16(code), []byte(code.String()))
	})
}

func (t *wsTransport) forceClose() { _ = t.s.NetConn().Close() }
