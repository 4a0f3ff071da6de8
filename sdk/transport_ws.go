package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lxzan/gws"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// wsConn carries frames over WebSocket, one binary message per frame. gws drives reading with
// callbacks, so wsConn is also the gws event handler; serve runs gws's read loop.
type wsConn struct {
	gws.BuiltinEventHandler // answers pings

	socket       *gws.Conn
	writeTimeout time.Duration
	closed       atomic.Bool

	// Set by serve before the read loop starts and read only by the gws callbacks it runs.
	handle   func(*clientpb.Frame)
	protoErr error // the server broke the protocol; reported instead of the close
	closeErr error // why the read loop ended

	wmu sync.Mutex // serializes a write with its deadline
	dmu sync.Mutex // orders a write's deadlines with closeWith's, so a write never undoes it
}

var _ frameConn = (*wsConn)(nil)

// dialWS connects to a ws:// or wss:// URL. gws's own dialer takes no context, so dialWS makes
// the TCP (and TLS) connection itself and lets gws do only the handshake, which it aborts by
// closing the connection when ctx ends.
func dialWS(ctx context.Context, rawURL string, cfg *Config) (*wsConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("bad ws_url: %w", err)
	}
	port := u.Port()
	switch {
	case u.Scheme != "ws" && u.Scheme != "wss":
		return nil, fmt.Errorf("bad ws_url %q: scheme must be ws or wss", rawURL)
	case port == "" && u.Scheme == "ws":
		port = "80"
	case port == "":
		port = "443"
	}
	addr := net.JoinHostPort(u.Hostname(), port)

	nc, err := cfg.Dialer(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "wss" {
		if nc, err = handshakeTLS(ctx, nc, u.Hostname(), cfg); err != nil {
			return nil, err
		}
	}

	w := &wsConn{writeTimeout: cfg.WriteTimeout}
	handshakeTimeout := cfg.AttemptTimeout
	if dl, ok := ctx.Deadline(); ok {
		handshakeTimeout = time.Until(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	socket, resp, err := gws.NewClientFromConn(w, &gws.ClientOption{
		Addr:               rawURL,
		HandshakeTimeout:   handshakeTimeout,
		ReadMaxPayloadSize: MaxFrameSize,
		Logger:             gwsLogger{cfg.Logger},
	}, nc)
	if !stop() {
		// ctx ended during the handshake and the connection is (being) closed.
		if err == nil {
			_ = nc.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		if ce := RefusedUpgrade(resp); ce != nil {
			return nil, ce
		}
		return nil, fmt.Errorf("websocket handshake: %w", err)
	}
	w.socket = socket
	return w, nil
}

func (w *wsConn) serve(handle func(*clientpb.Frame)) error {
	w.handle = handle
	w.socket.ReadLoop()
	if w.protoErr != nil {
		return w.protoErr
	}
	if w.closed.Load() {
		return net.ErrClosed
	}
	return w.closeErr
}

// OnMessage implements gws.Event.
func (w *wsConn) OnMessage(socket *gws.Conn, msg *gws.Message) {
	defer msg.Close()
	if w.protoErr != nil {
		return
	}
	if msg.Opcode != gws.OpcodeBinary {
		w.abort(fmt.Errorf("%w: websocket message with opcode %d, want binary", ErrProtocol, msg.Opcode))
		return
	}
	f := new(clientpb.Frame)
	if err := proto.Unmarshal(msg.Bytes(), f); err != nil {
		w.abort(fmt.Errorf("%w: bad frame: %w", ErrProtocol, err))
		return
	}
	w.handle(f)
}

// abort ends the connection because the server broke the protocol.
func (w *wsConn) abort(err error) {
	w.protoErr = err
	w.closeWith(1002) // protocol error
}

// OnClose implements gws.Event. err is a *gws.CloseError when the server sent a close frame.
func (w *wsConn) OnClose(socket *gws.Conn, err error) {
	var ce *gws.CloseError
	switch {
	case errors.As(err, &ce):
		code := uint32(ce.Code)
		if code == 0 {
			code = 1005 // the close frame carried no status
		}
		w.closeErr = &CloseError{Code: code, Reason: string(ce.Reason)}
	default:
		w.closeErr = &CloseError{Code: CodeAbnormalClosure, Err: err}
	}
}

func (w *wsConn) write(f *clientpb.Frame) error {
	b, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if err := w.writeDeadline(time.Now().Add(w.writeTimeout)); err != nil {
		return err
	}
	err = w.socket.WriteMessage(gws.OpcodeBinary, b)
	// A deadline left set is a runtime timer that wakes the process when it expires: an idle
	// client would wake WriteTimeout after every heartbeat.
	_ = w.writeDeadline(time.Time{})
	return err
}

// writeDeadline sets the write deadline unless the connection is closing (and does not undo
// closeWith's short deadline).
func (w *wsConn) writeDeadline(t time.Time) error {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	if w.closed.Load() {
		return net.ErrClosed
	}
	return w.socket.SetWriteDeadline(t)
}

func (w *wsConn) close() {
	if w.closed.Swap(true) {
		return
	}
	w.closeWith(1000)
}

// closeLinger bounds the wait to send a close frame: it is a courtesy, and a server that does
// not read must not hold up Close.
const closeLinger = 250 * time.Millisecond

// closeWith sends a close frame with code, then closes the connection. The short write deadline
// also cuts short a write blocked on a server that does not read, which holds gws's write lock.
func (w *wsConn) closeWith(code uint16) {
	w.dmu.Lock()
	w.closed.Store(true)
	_ = w.socket.SetWriteDeadline(time.Now().Add(closeLinger))
	w.dmu.Unlock()
	_ = w.socket.WriteClose(code, nil)
	// WriteClose does nothing if gws already closed the connection; make sure serve returns.
	_ = w.socket.NetConn().Close()
}

// gwsLogger sends gws's log lines to the Client's logger.
type gwsLogger struct{ log *slog.Logger }

func (l gwsLogger) Error(v ...any) { l.log.Error("roomcast: websocket", "msg", fmt.Sprint(v...)) }

// RefusedUpgrade is the CloseError of a WebSocket upgrade the ChatLink refused before the
// WebSocket opened (403 for 4014, 429 for 4015), from its Roomcast-Close-Code and Retry-After
// (seconds) headers; nil when resp names no close code. For clients that do their own
// handshake (the load generator's raw clients).
func RefusedUpgrade(resp *http.Response) *CloseError {
	if resp == nil {
		return nil
	}
	code, err := strconv.ParseUint(resp.Header.Get("Roomcast-Close-Code"), 10, 32)
	if err != nil || code < 4000 || code > 4999 {
		return nil
	}
	ce := &CloseError{Code: uint32(code), Reason: resp.Status}
	if s, err := strconv.ParseUint(resp.Header.Get("Retry-After"), 10, 32); err == nil && ce.Limited() {
		ce.RetryAfter = time.Duration(s) * time.Second
	}
	return ce
}
