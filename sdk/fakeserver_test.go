package sdk_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lxzan/gws"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// fakeLink is a scripted stand-in for a ChatLink: it accepts both transports and runs handler
// for each connection, so tests can provoke what a real server rarely does (kicks at login,
// silence, floods).
type fakeLink struct {
	handler  func(fakeConn)
	ln       net.Listener
	http     *httptest.Server
	wg       sync.WaitGroup
	mu       sync.Mutex // guards conns
	conns    map[io.Closer]struct{}
	accepted chan struct{} // one value per connection (the first 100 not taken)
}

// fakeConn is one server-side connection, with blocking reads whatever the transport.
type fakeConn interface {
	recv() (*clientpb.Frame, error)
	send(*clientpb.Frame) error
	// kick sends a Kick and closes the connection with its code.
	kick(code uint32, reason string)
	// sendPayload sends payload as one frame's bytes, whatever they are.
	sendPayload(payload []byte) error
	// wire writes b to the socket as it is, past the framing.
	wire(b []byte) error
	close()
}

func startFakeLink(t *testing.T, handler func(fakeConn)) *fakeLink {
	t.Helper()
	f, err := newFakeLink(handler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	return f
}

// newFakeLink starts a fake; stop stops it.
func newFakeLink(handler func(fakeConn)) (*fakeLink, error) {
	f := &fakeLink{handler: handler, conns: map[io.Closer]struct{}{}, accepted: make(chan struct{}, 100)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f.ln = ln
	f.wg.Add(1)
	go f.acceptTCP()
	f.http = httptest.NewServer(http.HandlerFunc(f.serveWS))
	return f, nil
}

func (f *fakeLink) endpoint(node string) sdk.Endpoint {
	return sdk.Endpoint{
		Node:    node,
		WSURL:   "ws" + strings.TrimPrefix(f.http.URL, "http") + "/v1/ws",
		TCPAddr: f.ln.Addr().String(),
	}
}

func (f *fakeLink) track(c io.Closer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false
	}
	f.conns[c] = struct{}{}
	select {
	case f.accepted <- struct{}{}:
	default: // a client that reconnects in a loop must not stop the fake
	}
	return true
}

func (f *fakeLink) untrack(c io.Closer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

func (f *fakeLink) stop() {
	_ = f.ln.Close()
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	f.http.Close()
	f.wg.Wait()
}

func (f *fakeLink) acceptTCP() {
	defer f.wg.Done()
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(nc) {
			_ = nc.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(nc)
			c := &tcpFake{nc: nc, br: bufio.NewReader(nc)}
			f.handler(c)
			c.close()
		}()
	}
}

func (f *fakeLink) serveWS(w http.ResponseWriter, r *http.Request) {
	c := &wsFake{frames: make(chan *clientpb.Frame, 1024), gone: make(chan struct{})}
	up := gws.NewUpgrader(c, &gws.ServerOption{ReadMaxPayloadSize: sdk.MaxFrameSize})
	socket, err := up.Upgrade(w, r)
	if err != nil {
		return
	}
	c.socket = socket
	nc := socket.NetConn()
	if !f.track(nc) {
		_ = nc.Close()
		return
	}
	defer f.untrack(nc)
	read := make(chan struct{})
	go func() { defer close(read); socket.ReadLoop() }()
	f.handler(c)
	c.close()
	<-read
}

type tcpFake struct {
	nc  net.Conn
	br  *bufio.Reader
	wmu sync.Mutex
}

func (c *tcpFake) recv() (*clientpb.Frame, error) { return testkit.ReadFrame(c.br) }

func (c *tcpFake) send(f *clientpb.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return testkit.WriteFrame(c.nc, f)
}

func (c *tcpFake) wire(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

func (c *tcpFake) sendPayload(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(testkit.TCPFrame(b))
	return err
}

func (c *tcpFake) kick(code uint32, reason string) {
	_ = c.send(kickFrame(code, reason))
	c.close()
}

func (c *tcpFake) close() { _ = c.nc.Close() }

type wsFake struct {
	gws.BuiltinEventHandler
	socket *gws.Conn
	frames chan *clientpb.Frame
	gone   chan struct{}
	once   sync.Once
}

func (c *wsFake) OnMessage(_ *gws.Conn, m *gws.Message) {
	defer m.Close()
	f := new(clientpb.Frame)
	if err := proto.Unmarshal(m.Bytes(), f); err != nil {
		c.kick(4003, "bad frame")
		return
	}
	select {
	case c.frames <- f:
	case <-c.gone:
	}
}

func (c *wsFake) OnClose(*gws.Conn, error) { c.once.Do(func() { close(c.gone) }) }

func (c *wsFake) recv() (*clientpb.Frame, error) {
	select {
	case f := <-c.frames:
		return f, nil
	case <-c.gone:
		return nil, errors.New("closed")
	}
}

func (c *wsFake) send(f *clientpb.Frame) error {
	b, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	return c.sendPayload(b)
}

func (c *wsFake) sendPayload(b []byte) error { return c.socket.WriteMessage(gws.OpcodeBinary, b) }

func (c *wsFake) wire(b []byte) error {
	_, err := c.socket.NetConn().Write(b)
	return err
}

func (c *wsFake) kick(code uint32, reason string) {
	_ = c.send(kickFrame(code, reason))
	_ = c.socket.WriteClose(uint16(code), []byte(reason))
}

func (c *wsFake) close() { _ = c.socket.WriteClose(1000, nil) }

func kickFrame(code uint32, reason string) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Kick{Kick: &clientpb.Kick{Code: code, Reason: reason}}}
}

// acceptLogin reads the Login and answers with a LoginAck for node with the heartbeat interval.
func acceptLogin(c fakeConn, node string, interval time.Duration) (*clientpb.Login, error) {
	f, err := c.recv()
	if err != nil {
		return nil, err
	}
	login := f.GetLogin()
	if login == nil {
		c.kick(4005, "login first")
		return nil, errors.New("no login")
	}
	err = c.send(&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{
		SessionId:           node + "-s1",
		ServerTimeMs:        time.Now().UnixMilli(),
		HeartbeatIntervalMs: uint32(interval / time.Millisecond),
		App:                 "demo", Room: "r1", Uid: "u1", Node: node,
	}}})
	return login, err
}

// serveBasic logs the client in and then answers Heartbeats, and Sends with a SendAck, or with
// an Error when the body is "refuse".
func serveBasic(node string, interval time.Duration) func(fakeConn) {
	return func(c fakeConn) {
		if _, err := acceptLogin(c, node, interval); err != nil {
			return
		}
		answerLoop(c)
	}
}

func answerLoop(c fakeConn) {
	for {
		f, err := c.recv()
		if err != nil {
			return
		}
		switch k := f.Kind.(type) {
		case *clientpb.Frame_Heartbeat:
			_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_HeartbeatAck{HeartbeatAck: &clientpb.HeartbeatAck{
				ClientTimeMs: k.Heartbeat.GetClientTimeMs(), ServerTimeMs: time.Now().UnixMilli(),
			}}})
		case *clientpb.Frame_Send:
			if string(k.Send.GetBody()) == "refuse" {
				_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
					Code: 102, Message: "slow down", Seq: k.Send.GetSeq(),
				}}})
				continue
			}
			_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{
				Seq: k.Send.GetSeq(), MessageId: "01HZZZZZZZZZZZZZZZZZZZZZZZ", ServerTimeMs: time.Now().UnixMilli(),
			}}})
		}
	}
}

// historyEnd is the Push that ends a history answer.
func historyEnd(recovered bool, missing uint64, msgs ...*clientpb.Message) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{
		Messages: msgs, History: true, Recovery: &clientpb.Recovery{Recovered: recovered, Missing: missing},
	}}}
}

func pushFrame(msgs ...*clientpb.Message) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: msgs}}}
}
