package chatlink

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"roomcast/proto/clientpb"
)

// The receive-only HTTP path for clients that cannot open a WebSocket (a proxy that refuses the
// upgrade, a runtime without WebSocket): Server-Sent Events on the WebSocket listener.
//
//	GET  /v1/sse?login=B64   the stream: B64 is a Login Frame, base64url. The first event,
//	                         "stream", carries the stream's key; then every frame the member
//	                         gets, one per event, base64 in the data line.
//	POST /v1/sse/KEY         one client Frame (Send, Heartbeat) as the body; 204. Its answer
//	                         comes in the stream.
//
// docs/protocol.md §2 describes it for clients. The key, 128 random bits, is what lets a POST
// act for the stream: session ids are not secret.
const (
	ssePath = "/v1/sse"
	// sseKeepAlive is how often an idle stream gets a comment line, so that proxies between
	// the node and the client do not time it out. Client heartbeats still come by POST.
	sseKeepAlive = 15 * time.Second
)

// sseServer serves the SSE path with net/http on connections that acceptWS hands over.
type sseServer struct {
	n     *Node
	srv   *http.Server
	conns chanListener

	mu      sync.Mutex // guards streams
	streams map[string]*conn
}

func newSSEServer(n *Node) *sseServer {
	s := &sseServer{n: n, streams: make(map[string]*conn), conns: newChanListener(n.wsLn.Addr())}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ssePath, s.stream)
	mux.HandleFunc("POST "+ssePath+"/{key}", s.post)
	mux.HandleFunc("OPTIONS "+ssePath+"/{key}", s.preflight)
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: wsHandshakeTimeout,
		IdleTimeout:       2 * time.Minute, // net/http never closes an idle keep-alive otherwise
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
	return s
}

// isSSERequest reports whether the request waiting in br is for the SSE path, without reading
// it. It peeks one byte more at a time, so that it waits only for a request that still looks
// like one for the SSE path: a short or foreign first line goes on to the WebSocket upgrade.
func isSSERequest(br *bufio.Reader) bool {
	candidates := []string{"GET " + ssePath, "POST " + ssePath, "OPTIONS " + ssePath}
	for n := 1; len(candidates) > 0; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return false
		}
		kept := candidates[:0]
		for _, c := range candidates {
			if n > len(c) {
				return strings.IndexByte("?/ ", b[len(c)]) >= 0 // the path ends or goes on below
			}
			if c[:n] == string(b) {
				kept = append(kept, c)
			}
		}
		candidates = kept
	}
	return false
}

// handOver gives the SSE server a connection whose request starts with what br has buffered.
func (s *sseServer) handOver(nc net.Conn, br *bufio.Reader) {
	buffered, _ := br.Peek(br.Buffered())
	_ = nc.SetDeadline(time.Time{})
	s.conns.push(&prefixedConn{Conn: nc, r: io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), nc)})
}

// serve runs the HTTP server until shutdown closes it.
func (s *sseServer) serve() {
	if err := s.srv.Serve(&s.conns); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.n.log.Warn("sse server", "err", err)
	}
}

// close stops the server. By the time the node calls it its conns are closed, so the streams
// are ending; it waits a moment for their handlers, then cuts what is left.
func (s *sseServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	_ = s.srv.Close()
}

func allowAnyOrigin(w http.ResponseWriter) {
	// No cookies are involved: a stream is reached by its token and its key, so any page may.
	w.Header().Set("Access-Control-Allow-Origin", "*")
}

func (s *sseServer) stream(w http.ResponseWriter, r *http.Request) {
	allowAnyOrigin(w)
	login, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(r.URL.Query().Get("login"), "="))
	if err != nil || len(login) == 0 || len(login) > s.n.cfg.MaxFrameBytes {
		http.Error(w, "login: a Login frame, base64url, is required", http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	key := hex.EncodeToString(raw[:])

	addr := s.n.limits.clientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), r.Header.Get("X-Real-IP"))
	if code := s.n.limits.admit(addr); code != 0 {
		s.n.m.closes.WithLabelValues(code.String()).Inc()
		status := http.StatusForbidden
		if code == clientpb.CloseCode_CLOSE_CODE_TOO_MANY_CONNECTIONS {
			status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.Itoa(int(connsRetryHint/time.Second)))
		}
		w.Header().Set("Roomcast-Close-Code", strconv.Itoa(int(code)))
		http.Error(w, code.String(), status)
		return
	}
	t := &sseTransport{wake: make(chan struct{}, 1)}
	c := s.n.newConn(t, addr)
	s.mu.Lock()
	s.streams[key] = c
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, key)
		s.mu.Unlock()
		c.closed()
	}()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "event: stream\ndata: "+key+"\n\n")
	flusher.Flush()
	c.handle(login) // the Login: its LoginAck (or Kick) is the next event

	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	var out []byte
	for {
		frames, last := t.take()
		out = out[:0]
		for _, f := range frames {
			out = append(out, "data: "...)
			out = base64.StdEncoding.AppendEncode(out, f)
			out = append(out, "\n\n"...)
		}
		if len(out) > 0 {
			_, err := w.Write(out)
			t.taken(frames)
			if err != nil {
				return
			}
			flusher.Flush()
		}
		if last {
			return
		}
		select {
		case <-t.wake:
		case <-keepAlive.C:
			if _, err := io.WriteString(w, ":\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

func (s *sseServer) post(w http.ResponseWriter, r *http.Request) {
	allowAnyOrigin(w)
	s.mu.Lock()
	c := s.streams[r.PathValue("key")]
	s.mu.Unlock()
	if c == nil {
		http.Error(w, "no such stream", http.StatusNotFound)
		return
	}
	// A body announced and never sent must not hold the connection open (slow loris): the
	// server has no ReadTimeout, which would also cut the long-lived GET streams.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(wsHandshakeTimeout)) // a socket deadline: real time, not the node's clock
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.n.cfg.MaxFrameBytes)+1))
	switch {
	case err != nil:
		http.Error(w, "reading the frame: "+err.Error(), http.StatusBadRequest)
		return
	case len(body) > s.n.cfg.MaxFrameBytes:
		c.close(clientpb.CloseCode_CLOSE_CODE_FRAME_TOO_LARGE, "frame too large")
		http.Error(w, "frame too large", http.StatusRequestEntityTooLarge)
		return
	}
	c.handle(body) // an empty body does not parse: BAD_FRAME, in the stream
	w.WriteHeader(http.StatusNoContent)
}

// preflight answers a browser's CORS preflight for a POST with a binary body.
func (s *sseServer) preflight(w http.ResponseWriter, r *http.Request) {
	allowAnyOrigin(w)
	w.Header().Set("Access-Control-Allow-Methods", "POST")
	w.Header().Set("Access-Control-Allow-Headers", "Content-Type")
	w.Header().Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

// sseTransport queues a stream's frames for its handler, which writes them as events.
type sseTransport struct {
	wake chan struct{} // a frame was queued or the stream should end

	mu      sync.Mutex // guards the fields below
	queue   [][]byte
	closing bool // end the stream once the queue is written (a Kick is the last frame)
	closed  bool // end the stream now

	backlog atomic.Int64 // bytes queued or being written
}

var _ transport = (*sseTransport)(nil)

func (t *sseTransport) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *sseTransport) write(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing || t.closed {
		return
	}
	t.queue = append(t.queue, b)
	t.backlog.Add(int64(len(b)))
	t.signal()
}

func (t *sseTransport) pending() int64 { return t.backlog.Load() }

func (t *sseTransport) kick(_ clientpb.CloseCode, kick []byte) {
	t.write(kick)
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	t.signal()
}

func (t *sseTransport) forceClose() {
	t.mu.Lock()
	t.closed, t.queue = true, nil
	t.mu.Unlock()
	t.signal()
}

// take returns the queued frames, and whether the stream ends after them.
func (t *sseTransport) take() (frames [][]byte, last bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	frames, t.queue = t.queue, nil
	if t.closed {
		return nil, true
	}
	return frames, t.closing
}

// taken counts frames as written.
func (t *sseTransport) taken(frames [][]byte) {
	var n int64
	for _, f := range frames {
		n += int64(len(f))
	}
	t.backlog.Add(-n)
}

// chanListener is a net.Listener whose connections are pushed to it.
type chanListener struct {
	addr   net.Addr
	ch     chan net.Conn
	done   chan struct{}
	closer sync.Once
}

func newChanListener(addr net.Addr) chanListener {
	return chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closer.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// prefixedConn reads what was read ahead of the HTTP server first.
type prefixedConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
