package testkit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lxzan/gws"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/osdep"
	"roomcast/proto/clientpb"
)

// NextTimeout is how long Next waits for a frame before it fails the test.
const NextTimeout = 5 * time.Second

// Client speaks the client protocol (docs/protocol.md) by hand over either transport, so a test
// can send what no SDK would and see every frame the server sends. A goroutine reads the
// server's frames into a buffer until the connection ends; Close (also run when the test ends)
// closes the connection and waits for it.
type Client struct {
	t      testing.TB
	ws     *gws.Conn // nil over TCP
	nc     net.Conn
	frames chan *clientpb.Frame
	// done is closed when the reader has stopped: the connection has ended and every frame
	// it carried is in frames. code is written before.
	done chan struct{}
	code uint16 // the WebSocket close code; 0 over TCP or when the close carried none
	// closing is closed by Close, so a reader blocked on a full frames buffer lets go.
	closing   chan struct{}
	closeOnce sync.Once

	mu      sync.Mutex // guards the fields below
	resumed sync.Cond  // signalled when paused turns false or closed true
	paused  bool       // the TCP reader waits before its next read
	closed  bool
}

func newClient(t testing.TB) *Client {
	c := &Client{t: t, frames: make(chan *clientpb.Frame, 1024), done: make(chan struct{}), closing: make(chan struct{})}
	c.resumed.L = &c.mu
	return c
}

// DialWS opens a WebSocket to url (the ChatLink's /v1/ws) and closes it when the test ends.
func DialWS(t testing.TB, url string) *Client {
	t.Helper()
	return dialWS(t, url, nil)
}

// DialWSFor is DialWS through a proxy forwarding for client: the upgrade carries
// X-Forwarded-For: client.
func DialWSFor(t testing.TB, url, client string) *Client {
	t.Helper()
	return dialWS(t, url, http.Header{"X-Forwarded-For": {client}})
}

func dialWS(t testing.TB, url string, header http.Header) *Client {
	t.Helper()
	c := newClient(t)
	socket, _, err := gws.NewClient(wsEvents{c: c}, &gws.ClientOption{Addr: url, RequestHeader: header})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.ws, c.nc = socket, socket.NetConn()
	go func() { defer close(c.done); socket.ReadLoop() }()
	t.Cleanup(c.Close)
	return c
}

type wsEvents struct {
	gws.BuiltinEventHandler
	c *Client
}

func (h wsEvents) OnMessage(_ *gws.Conn, m *gws.Message) {
	defer m.Close()
	var f clientpb.Frame
	if err := proto.Unmarshal(m.Bytes(), &f); err != nil {
		h.c.t.Errorf("server sent a frame that does not parse: %v", err)
		return
	}
	h.c.deliver(&f)
}

// OnClose runs on the reader goroutine before ReadLoop returns, so code is set before done
// closes.
func (h wsEvents) OnClose(_ *gws.Conn, err error) {
	if ce := (*gws.CloseError)(nil); errors.As(err, &ce) {
		h.c.code = ce.Code
	}
}

// DialOption sets how DialTCP connects.
type DialOption func(*dialOptions)

type dialOptions struct {
	rcvbuf int
	paused bool
}

// ReceiveBuffer sets the socket's receive buffer (SO_RCVBUF) to n bytes before it connects, so
// that what the server sends fills it soon when the client does not read.
func ReceiveBuffer(n int) DialOption { return func(o *dialOptions) { o.rcvbuf = n } }

// Paused starts the client paused: it reads nothing, not even the answer to its Login, until
// Resume.
func Paused() DialOption { return func(o *dialOptions) { o.paused = true } }

// DialTCP opens a connection to the TCP transport at addr and closes it when the test ends.
func DialTCP(t testing.TB, addr string, opts ...DialOption) *Client {
	t.Helper()
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	var d net.Dialer
	if o.rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = osdep.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, o.rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := newClient(t)
	c.nc, c.paused = nc, o.paused
	go c.readTCP()
	t.Cleanup(c.Close)
	return c
}

func (c *Client) readTCP() {
	defer close(c.done)
	br := bufio.NewReader(c.nc)
	for {
		c.mu.Lock()
		for c.paused && !c.closed {
			c.resumed.Wait()
		}
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		f, err := ReadFrame(br)
		switch {
		case err != nil && f != nil: // the bytes came, but are no Frame
			c.t.Errorf("server sent a frame that does not parse: %v", err)
			continue
		case err != nil:
			return
		}
		c.deliver(f)
	}
}

func (c *Client) deliver(f *clientpb.Frame) {
	select {
	case c.frames <- f:
	case <-c.closing:
	}
}

// Close closes the connection and waits for the reader to stop. It may be called more than once.
func (c *Client) Close() {
	c.closeOnce.Do(func() {
		close(c.closing)
		c.mu.Lock()
		c.closed = true
		c.resumed.Broadcast()
		c.mu.Unlock()
		_ = c.nc.Close()
	})
	<-c.done
}

// Send sends f as one frame, failing the test if it cannot.
func (c *Client) Send(f *clientpb.Frame) {
	c.t.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.SendPayload(b); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// SendPayload sends b as one frame's bytes, whatever they are: one binary message over
// WebSocket, b behind its length prefix over TCP.
func (c *Client) SendPayload(b []byte) error {
	if c.ws != nil {
		return c.ws.WriteMessage(gws.OpcodeBinary, b)
	}
	_, err := c.nc.Write(TCPFrame(b))
	return err
}

// SendText sends s as a WebSocket text message, which the protocol does not allow.
func (c *Client) SendText(s string) error {
	if c.ws == nil {
		return errors.New("testkit: a text message needs a WebSocket")
	}
	return c.ws.WriteString(s)
}

// Write writes b to the socket as it is: no length prefix, no WebSocket framing.
func (c *Client) Write(b []byte) error {
	_, err := c.nc.Write(b)
	return err
}

// Ping sends a WebSocket ping.
func (c *Client) Ping() error {
	if c.ws == nil {
		return errors.New("testkit: a ping needs a WebSocket")
	}
	return c.ws.WritePing(nil)
}

// Pause stops the TCP reader before its next frame, so what the server sends piles up in the
// socket's buffers.
func (c *Client) Pause() {
	c.mu.Lock()
	c.paused = true
	c.mu.Unlock()
}

// Resume lets a paused TCP reader read on.
func (c *Client) Resume() {
	c.mu.Lock()
	c.paused = false
	c.resumed.Broadcast()
	c.mu.Unlock()
}

// Login logs in with token from device "test" and fails the test unless the answer is a
// LoginAck.
func (c *Client) Login(token string) *clientpb.LoginAck {
	c.t.Helper()
	f := c.LoginAs(token, "test")
	ack := f.GetLoginAck()
	if ack == nil {
		c.t.Fatalf("login answered with %v", f)
	}
	return ack
}

// LoginAs sends a Login with token from device and returns the first answer: a LoginAck, or a
// Kick.
func (c *Client) LoginAs(token, device string) *clientpb.Frame {
	c.t.Helper()
	c.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: token, Device: device}}})
	return c.Next()
}

// Next returns the next frame from the server. It fails the test if the connection ends first,
// or if none comes in NextTimeout.
func (c *Client) Next() *clientpb.Frame {
	c.t.Helper()
	return c.NextWithin(NextTimeout)
}

// NextWithin is Next, waiting at most d.
func (c *Client) NextWithin(d time.Duration) *clientpb.Frame {
	c.t.Helper()
	if f, ok := c.next(d); ok {
		return f
	}
	select {
	case <-c.done:
		c.t.Fatalf("connection closed (code %d) with no frame", c.code)
	default:
		c.t.Fatalf("no frame from the server in %v", d)
	}
	return nil
}

// next returns the next frame, or false when the connection ended or d passed first.
func (c *Client) next(d time.Duration) (*clientpb.Frame, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case f := <-c.frames:
		return f, true
	case <-c.done:
		// Every frame the connection carried is buffered by now.
		select {
		case f := <-c.frames:
			return f, true
		default:
			return nil, false
		}
	case <-timer.C:
		return nil, false
	}
}

// CollectPushes reads frames until n messages have come, failing the test on any frame that is
// not a Push, and returns the messages and the number of Push frames they came in.
func (c *Client) CollectPushes(n int) (msgs []*clientpb.Message, frames int) {
	c.t.Helper()
	for len(msgs) < n {
		f := c.Next()
		if f.GetPush() == nil {
			c.t.Fatalf("want a Push, got %v", f)
		}
		frames++
		msgs = append(msgs, f.GetPush().Messages...)
	}
	return msgs, frames
}

// Frames returns the buffer of frames not yet taken, for a test that selects on it.
func (c *Client) Frames() <-chan *clientpb.Frame { return c.frames }

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// ExpectKick fails the test unless the next frame is a Kick with code and the connection then
// closes: over WebSocket with a close frame carrying the same code.
func (c *Client) ExpectKick(code clientpb.CloseCode) *clientpb.Kick {
	c.t.Helper()
	f := c.Next()
	if f.GetKick() == nil || f.GetKick().Code != uint32(code) {
		c.t.Fatalf("want Kick %v, got %v", code, f)
	}
	c.expectKickClose(code)
	return f.GetKick()
}

// ExpectKickAfterPushes is ExpectKick for a member that may have Pushes not yet read: it skips
// them, and fails on any other frame before the Kick.
func (c *Client) ExpectKickAfterPushes(code clientpb.CloseCode) {
	c.t.Helper()
	f := c.Next()
	for f.GetPush() != nil {
		f = c.Next()
	}
	if f.GetKick() == nil || f.GetKick().Code != uint32(code) {
		c.t.Fatalf("want Kick %v, got %v", code, f)
	}
	c.expectKickClose(code)
}

func (c *Client) expectKickClose(code clientpb.CloseCode) {
	c.t.Helper()
	if c.ws != nil {
		c.ExpectClose(uint16(code))
	} else {
		c.ExpectClose(0)
	}
}

// ExpectClose fails the test unless the connection ends within NextTimeout with the WebSocket
// close code (0 over TCP).
func (c *Client) ExpectClose(code uint16) {
	c.t.Helper()
	select {
	case <-c.done:
		if c.code != code {
			c.t.Fatalf("closed with %d, want %d", c.code, code)
		}
	case <-time.After(NextTimeout):
		c.t.Fatalf("connection not closed in %v (want code %d)", NextTimeout, code)
	}
}

// ExpectSilence fails the test if a frame is waiting or arrives within d.
func (c *Client) ExpectSilence(d time.Duration) {
	c.t.Helper()
	select {
	case f := <-c.frames:
		c.t.Fatalf("unexpected frame %v", f)
	default:
	}
	select {
	case f := <-c.frames:
		c.t.Fatalf("unexpected frame %v", f)
	case <-time.After(d):
	}
}
