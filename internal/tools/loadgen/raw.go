package loadgen

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lxzan/gws"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/netpoll"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// Client kinds of a fanout member (Config.Client).
const (
	ClientSDK = "sdk" // sdk.Client, as an app uses it
	ClientRaw = "raw" // rawClient: the protocol spoken directly, for the least CPU per delivery
)

// memberConn is what the fleet needs of a member's connection.
type memberConn interface {
	Err() error // why the connection ended; nil while it is open
	Close() error
}

// Field numbers of the frames rawClient reads (proto/client.proto, proto/message.proto).
const (
	frameLoginAck  = 2
	frameSendAck   = 4
	framePush      = 5
	frameHbAck     = 7
	frameError     = 8
	frameKick      = 9
	frameCounters  = 18 // CounterTotals
	frameViewers   = 19 // ViewerCount
	frameNotice    = 20 // MemberNotice
	frameAttrs     = 21 // RoomAttributes
	pushMessages   = 1
	pushThinned    = 4
	messageLane    = 5
	messageBody    = 7
	rawReadBuffer  = 16 << 10
	rawLoginWait   = 15 * time.Second
	rawWriteTimout = 10 * time.Second

	rawDefaultHeartbeat = 25 * time.Second // the SDK's, for a server that names no interval
)

// rawClient is a fanout member that speaks the protocol itself (--client raw) instead of
// through sdk.Client: one reader goroutine, Push frames walked in place with protowire and no
// allocation per message. The load generator shares the server's cores, and in the big runs
// the SDK's decoding and per-message events took more CPU than the server; this client leaves
// more of the machine to the server. It logs in, hands every pushed message to onMsg and
// sends heartbeats when asked (at the interval the server last gave, as the SDK does); it
// does not reconnect.
type rawClient struct {
	nc    net.Conn
	ws    *gws.Conn // nil over TCP
	onMsg func(lane int32, body []byte)
	hooks rawHooks
	acked chan struct{} // closed at the LoginAck
	node  string        // the node the LoginAck named; written before acked is closed

	// beatEvery is the heartbeat interval the server gave in the LoginAck and its latest
	// HeartbeatAck, in nanoseconds. nextBeat (unix nanoseconds) is set at the login and then
	// read and written only by the fleet's heartbeat goroutine.
	beatEvery atomic.Int64
	nextBeat  int64

	wmu sync.Mutex // serialises TCP writes

	isWS bool // WebSocket framing, else length-prefixed TCP

	// Set when a poller reads the socket (rawPollers.add), which then owns fd, the socket
	// taken out of Go's runtime (nc is closed); part is touched only by that poller's reads.
	poll    *rawPoller
	pollID  uint64
	fd      *netpoll.FD // nil when not polled
	dropped bool        // the poller has let go of fd and closed it; guarded by poll.mu
	part    []byte      // an incomplete frame's bytes

	// The room's "like" total and its version, as the last CounterTotals frame (of a greater
	// version than the one before) said, and the CounterTotals frames received. Written by
	// the member's reader.
	likes, likesVersion, counterFrames atomic.Int64
	likeSeqs                           atomic.Uint64 // the member's likes sent
	// liveFrames counts the live state frames received (ViewerCount, MemberNotice,
	// RoomAttributes: a Login with live_state, fanout --live-state).
	liveFrames atomic.Int64

	mu   sync.Mutex // guards err
	err  error
	done chan struct{} // closed when the reader ends
}

var errClosedByLoadgen = errors.New("bench: closed")

// rawHooks are what a raw member asks for and hears besides messages (bench upload, fanout
// --live-state); nil fields are not called. They run on the goroutine that reads the member's
// socket.
type rawHooks struct {
	// liveState sets the Login's live_state: the member receives the room's viewer counts,
	// member notices and attributes (counted in rawClient.liveFrames).
	liveState bool
	// onAnswer gets the answer to a Send: code 0 for a SendAck, else the Error's code.
	onAnswer func(seq uint64, code uint32)
	// onThinned gets the messages a Push says were left out of the member's stream.
	onThinned func(n int64)
	// onLikeRefused gets the code of an Error refusing one of the member's likes (likeSeq).
	onLikeRefused func(code uint32)
}

// likeSeq is the first seq of a member's likes (CounterAdds), above its Sends'.
const likeSeq = 1 << 62

// dialRaw dispatches, connects and logs in one raw member. With a nil onMsg the member is a
// slow one (fanout --slow): a small receive buffer, the Login sent, and nothing ever read (so
// no LoginAck is waited for either). With pollers, one of them reads the socket; without, a
// reader goroutine of the member's own. A node that serves TLS (wss://, tcp_tls) is spoken to
// over TLS with tlsCfg, always by a reader goroutine: the pollers read plaintext sockets.
func dialRaw(ctx context.Context, hc *http.Client, dispatcher, transport, token string,
	dial func(ctx context.Context, network, addr string) (net.Conn, error), tlsCfg *tls.Config, pollers *rawPollers,
	onMsg func(lane int32, body []byte), hooks rawHooks) (*rawClient, error) {
	eps, err := sdk.Dispatch(ctx, hc, dispatcher, token)
	if err != nil {
		return nil, err
	}
	ep := eps[0] // a successful answer names at least one node
	overTLS := ep.TCPTLS && transport == sdk.TransportTCP || strings.HasPrefix(ep.WSURL, "wss:") && transport != sdk.TransportTCP
	login, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{
		Token: token, Device: "bench", Client: "roomcast-bench-raw", LiveState: hooks.liveState}}})
	if err != nil {
		return nil, err
	}
	c := &rawClient{onMsg: onMsg, hooks: hooks, acked: make(chan struct{}), done: make(chan struct{}), isWS: transport != sdk.TransportTCP}
	slow := onMsg == nil
	if slow {
		close(c.done) // no reader
	}
	ctx, cancel := context.WithTimeout(ctx, rawLoginWait)
	defer cancel()
	addr := ep.TCPAddr
	if c.isWS {
		u, perr := url.Parse(ep.WSURL)
		if perr != nil {
			return nil, perr
		}
		addr = u.Host
	}
	if c.nc, err = dial(ctx, "tcp", addr); err != nil {
		return nil, err
	}
	if slow {
		_ = c.nc.(*net.TCPConn).SetReadBuffer(slowReceiveBuffer)
	}
	if overTLS {
		cfg := tlsCfg.Clone() // the clones share the session cache
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(c.nc, cfg)
		if err = tc.HandshakeContext(ctx); err != nil {
			_ = c.nc.Close()
			return nil, fmt.Errorf("tls handshake: %w", err)
		}
		c.nc, pollers = tc, nil
	}
	if c.isWS {
		// gws upgrades and writes; the bench reads the frames itself.
		stop := context.AfterFunc(ctx, func() { _ = c.nc.Close() })
		var resp *http.Response
		c.ws, resp, err = gws.NewClientFromConn(gws.BuiltinEventHandler{}, &gws.ClientOption{
			Addr: ep.WSURL, HandshakeTimeout: rawLoginWait,
		}, c.nc)
		stop()
		if err != nil {
			_ = c.nc.Close()
			if ce := sdk.RefusedUpgrade(resp); ce != nil {
				return nil, ce
			}
			return nil, err
		}
	}
	// The server sends nothing after its handshake answer until the LoginAck, so nothing is
	// buffered past it: from here on the poller, or the member's reader, reads the socket.
	switch {
	case slow:
	case pollers != nil:
		if err = pollers.add(c); err != nil {
			_ = c.nc.Close()
			return nil, err
		}
	default:
		go c.readLoop()
	}
	err = c.write(login)
	if err == nil && !slow {
		select {
		case <-c.acked:
		case <-c.done:
			err = c.Err()
		case <-ctx.Done():
			err = fmt.Errorf("no LoginAck: %w", ctx.Err())
		}
	}
	if err != nil {
		_ = c.Close()
		<-c.done
		return nil, err
	}
	c.setBeatEvery(0) // the default, when no LoginAck was read (a slow member)
	c.nextBeat = time.Now().UnixNano() + c.beatEvery.Load()
	return c, nil
}

// send sends one Send frame; its answer goes to hooks.onAnswer.
func (c *rawClient) send(seq uint64, lane clientpb.Lane, body []byte) error {
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
		Seq: seq, Type: "danmaku", Lane: lane, Body: body}}})
	if err != nil {
		return err
	}
	return c.write(b)
}

// like taps the room's counter "like" once; a refusal goes to hooks.onLikeRefused.
func (c *rawClient) like() error {
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_CounterAdd{CounterAdd: &clientpb.CounterAdd{
		Seq: likeSeq + c.likeSeqs.Add(1), Name: "like", Amount: 1}}})
	if err != nil {
		return err
	}
	return c.write(b)
}

// heartbeat sends one Heartbeat frame.
func (c *rawClient) heartbeat() {
	b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{
		ClientTimeMs: time.Now().UnixMilli()}}})
	_ = c.write(b)
}

func (c *rawClient) write(b []byte) error {
	if c.poll != nil {
		return c.writePolled(0x2, b)
	}
	if c.ws != nil {
		return c.ws.WriteMessage(gws.OpcodeBinary, b)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(rawWriteTimout))
	_, err := c.nc.Write(lengthPrefixed(b))
	return err
}

// lengthPrefixed frames b for the TCP transport.
func lengthPrefixed(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))), b...)
}

func (c *rawClient) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.err, errClosedByLoadgen) {
		return nil
	}
	return c.err
}

func (c *rawClient) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// Close ends the connection and waits for the reader.
func (c *rawClient) Close() error {
	c.fail(errClosedByLoadgen)
	if c.poll != nil {
		c.poll.remove(c) // closes the socket
	} else {
		_ = c.nc.Close()
	}
	<-c.done
	return nil
}

// readLoop reads the socket on a goroutine of the member's own (no pollers) and hands what
// arrives to feed.
func (c *rawClient) readLoop() {
	defer close(c.done)
	buf := make([]byte, rawReadBuffer)
	for {
		n, err := c.nc.Read(buf)
		if n > 0 {
			if ferr := c.feed(buf[:n]); ferr != nil {
				c.fail(ferr)
				_ = c.nc.Close()
				return
			}
		}
		if err != nil {
			c.fail(fmt.Errorf("connection closed: %w", err))
			return
		}
	}
}

// maxRawFrame bounds a frame a raw member accepts.
const maxRawFrame = 16 << 20

// feed acts on the whole frames in data, as read from the socket, and keeps an incomplete
// frame's bytes for the next read.
func (c *rawClient) feed(data []byte) error {
	if len(c.part) > 0 {
		c.part = append(c.part, data...)
		data = c.part
	}
	for len(data) > 0 {
		n, err := c.nextFrame(data)
		if err != nil {
			return err
		}
		if n == 0 {
			break // incomplete
		}
		data = data[n:]
	}
	c.part = append(c.part[:0], data...) // may overlap: append copies as memmove does
	if len(c.part) == 0 && cap(c.part) > rawReadBuffer {
		c.part = nil // a big frame's buffer is not kept
	}
	return nil
}

// nextFrame acts on the frame at the start of data and returns its length, or 0 when data
// holds only part of it. Server WebSocket frames are unmasked and unfragmented.
func (c *rawClient) nextFrame(data []byte) (int, error) {
	if !c.isWS {
		if len(data) < 4 {
			return 0, nil
		}
		n := int(binary.BigEndian.Uint32(data))
		if n > maxRawFrame {
			return 0, fmt.Errorf("frame of %d bytes", n)
		}
		if len(data) < 4+n {
			return 0, nil
		}
		c.frame(data[4 : 4+n])
		return 4 + n, nil
	}
	if len(data) < 2 {
		return 0, nil
	}
	fin, op, masked := data[0]&0x80 != 0, data[0]&0x0f, data[1]&0x80 != 0
	n, hdr := uint64(data[1]&0x7f), 2
	switch n {
	case 126:
		if len(data) < 4 {
			return 0, nil
		}
		n, hdr = uint64(binary.BigEndian.Uint16(data[2:])), 4
	case 127:
		if len(data) < 10 {
			return 0, nil
		}
		n, hdr = binary.BigEndian.Uint64(data[2:]), 10
	}
	switch {
	case masked:
		return 0, errors.New("masked frame from the server")
	case n > maxRawFrame:
		return 0, fmt.Errorf("frame of %d bytes", n)
	case uint64(len(data)-hdr) < n:
		return 0, nil
	}
	end := hdr + int(n)
	payload := data[hdr:end]
	switch op {
	case 1, 2: // text, binary
		if !fin {
			return 0, errors.New("fragmented frame from the server")
		}
		c.frame(payload)
	case 8:
		code := 1005
		if len(payload) >= 2 {
			code = int(binary.BigEndian.Uint16(payload))
		}
		return 0, fmt.Errorf("connection closed: close frame %d", code)
	case 9:
		if c.poll != nil {
			_ = c.writePolled(0xA, payload)
		} else {
			_ = c.ws.WritePong(payload)
		}
	case 10:
	default:
		return 0, fmt.Errorf("frame with opcode %d from the server", op)
	}
	return end, nil
}

// frame acts on one server frame: the LoginAck, each message of a Push, a Kick.
func (c *rawClient) frame(b []byte) {
	for {
		num, v, rest, err := lenField(b)
		if err != nil {
			c.fail(err)
			return
		}
		if v == nil {
			return
		}
		b = rest
		switch num {
		case frameLoginAck:
			var ack clientpb.LoginAck
			_ = proto.Unmarshal(v, &ack)
			c.setBeatEvery(ack.GetHeartbeatIntervalMs())
			select {
			case <-c.acked:
			default:
				c.node = ack.GetNode()
				close(c.acked)
			}
		case frameSendAck:
			if c.hooks.onAnswer != nil {
				var ack clientpb.SendAck
				_ = proto.Unmarshal(v, &ack)
				c.hooks.onAnswer(ack.GetSeq(), 0)
			}
		case frameError:
			var e clientpb.Error
			_ = proto.Unmarshal(v, &e)
			switch seq := e.GetSeq(); {
			case seq > likeSeq:
				if c.hooks.onLikeRefused != nil {
					c.hooks.onLikeRefused(max(e.GetCode(), 1))
				}
			case seq != 0 && c.hooks.onAnswer != nil:
				c.hooks.onAnswer(seq, max(e.GetCode(), 1))
			}
		case frameCounters:
			var t clientpb.CounterTotals
			_ = proto.Unmarshal(v, &t)
			c.counterFrames.Add(1)
			if v := int64(t.GetVersion()); v > c.likesVersion.Load() {
				var like int64
				for _, ct := range t.GetCounters() {
					if ct.GetName() == "like" {
						like = ct.GetTotal()
					}
				}
				c.likes.Store(like)
				c.likesVersion.Store(v)
			}
		case frameViewers, frameNotice, frameAttrs:
			c.liveFrames.Add(1)
		case frameHbAck:
			var ack clientpb.HeartbeatAck
			_ = proto.Unmarshal(v, &ack)
			c.setBeatEvery(ack.GetHeartbeatIntervalMs())
		case framePush:
			c.push(v)
		case frameKick:
			var k clientpb.Kick
			_ = proto.Unmarshal(v, &k)
			c.fail(&sdk.CloseError{Code: k.GetCode(), Reason: k.GetReason(), RetryAfter: time.Duration(k.GetRetryAfterMs()) * time.Millisecond})
		}
	}
}

var errBadFrame = errors.New("bad frame")

// setBeatEvery takes the heartbeat interval of a LoginAck or HeartbeatAck; an answer without
// one keeps the interval the member has, or the SDK's default.
func (c *rawClient) setBeatEvery(ms uint32) {
	switch {
	case ms > 0:
		c.beatEvery.Store(int64(time.Duration(ms) * time.Millisecond))
	case c.beatEvery.Load() == 0:
		c.beatEvery.Store(int64(rawDefaultHeartbeat))
	}
}

// lenField returns the first length-delimited field of b, skipping fields of other types: its
// number, its bytes and the rest of b. v is nil at the end of b.
func lenField(b []byte) (num protowire.Number, v, rest []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, nil, nil, errBadFrame
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return 0, nil, nil, errBadFrame
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, nil, nil, errBadFrame
		}
		if v == nil {
			v = []byte{} // present, if empty
		}
		return num, v, b[n:], nil
	}
	return 0, nil, nil, nil
}

// push hands each message of a Push to onMsg.
func (c *rawClient) push(b []byte) {
	for {
		num, m, rest, err := lenField(b)
		if err != nil || m == nil {
			return
		}
		b = rest
		if num == pushThinned && c.hooks.onThinned != nil {
			var t clientpb.Thinned
			_ = proto.Unmarshal(m, &t)
			c.hooks.onThinned(int64(t.GetNormal()) + int64(t.GetBulk()))
		}
		if num != pushMessages {
			continue
		}
		var lane int32
		var body []byte
		for len(m) > 0 {
			num, typ, n := protowire.ConsumeTag(m)
			if n < 0 {
				break
			}
			m = m[n:]
			switch {
			case num == messageLane && typ == protowire.VarintType:
				v, n := protowire.ConsumeVarint(m)
				if n < 0 {
					return
				}
				lane, m = int32(v), m[n:]
			case num == messageBody && typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(m)
				if n < 0 {
					return
				}
				body, m = v, m[n:]
			default:
				if n = protowire.ConsumeFieldValue(num, typ, m); n < 0 {
					return
				}
				m = m[n:]
			}
		}
		c.onMsg(lane, body)
	}
}
