package chatlink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"net/netip"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/internal/ratelimit"
	"roomcast/internal/tracing"
	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// ProtocolVersion is the version of the client protocol (docs/protocol.md) a ChatLink speaks,
// sent in every LoginAck.
const ProtocolVersion = 1

// transport is what a conn needs of its WebSocket or TCP connection.
type transport interface {
	// write queues one encoded Frame and returns at once. b must not change afterwards: it may
	// be shared by many connections.
	write(b []byte)
	// pending returns the bytes queued and not yet taken by the socket.
	pending() int64
	// kick queues a Kick frame, then closes the connection with code.
	kick(code clientpb.CloseCode, kick []byte)
	// forceClose closes the connection without a goodbye.
	forceClose()
}

type connState int32

const (
	stateNew connState = iota
	stateLoggingIn
	stateLive
	stateClosed
)

// conn is one client connection, from accept to close.
type conn struct {
	node     *Node
	t        transport
	lastSeen atomic.Int64 // unix nanoseconds of the last frame received (or of the connect)
	accepted int64        // unix nanoseconds of the connect: the login deadline runs from here
	// The client's address (behind a trusted proxy, the one it forwarded), IPv4 mapped; zero
	// when unknown. Not a netip.Addr, whose zone handle would cost 8 more bytes per connection.
	addr16     [16]byte
	hbInterval atomic.Uint32 // milliseconds: the heartbeat interval this client was told
	closing    atomic.Bool   // a Kick is on its way; frames from the client are ignored

	// Touched only by the connection's reader.
	lastBeat    int64 // unix nanoseconds of the last heartbeat
	beatsOnTime uint8

	slot uint8 // the member's phase slot in its room (fanout.go); set at join, under the room's lock
	// cdnAcked: the LoginAck is written, the room's CDN config changes may follow (cdn.go).
	// Guarded by the room's lock.
	cdnAcked bool
	// critical: the member's token grants it the critical lane (the lanes claim). Set once by
	// login before the conn joins its room, read-only afterwards.
	critical bool
	// liveState: the client asked for the room's live state frames (Login.live_state:
	// viewers.go). Set once by login before the conn joins its room, read-only afterwards.
	liveState bool
	// streamed: the session's login is on the session stream and its logout is not
	// (eventbatcher.go). Guarded by the node's eventBatcher.mu.
	streamed bool

	// Set once by login before the conn joins its room, read-only afterwards.
	session, app, room, uid, device string
	loginMS                         int64 // unix milliseconds of the login

	// The member's tag set, interned; set at login, replaced when the app server changes the
	// member's tags (setTags), read by the fan-out at every tick.
	tags atomic.Pointer[tag.Set]

	mu      sync.Mutex // guards the fields below; lock order: conn.mu -> the tag interner's lock
	state   connState
	sending bool // sendLoop is running (next to state: the two share a word)
	// History queries waiting for the room service (history.go); in the same word.
	historyQ uint8
	sends    *connSends // nil until the first Send or CounterAdd
	acks     *inboxAcks // the Acks waiting for the store (inbox.go); nil until the first use
}

func (n *Node) newConn(t transport, addr netip.Addr) *conn {
	c := &conn{node: n, t: t, accepted: n.now().UnixNano()}
	if addr.IsValid() {
		c.addr16 = addr.As16()
	}
	c.lastSeen.Store(c.accepted)
	c.hbInterval.Store(uint32(n.cfg.HeartbeatInterval.Milliseconds()))
	n.conns.add(c)
	n.m.connections.Inc()
	return c
}

// connSends are a connection's sends waiting for the room service and its send rate
// (limits.go). Guarded by the conn's mu.
type connSends struct {
	q       []*clientpb.Send // oldest first, when each send is its own request (SendWindow < 0)
	waiting int              // sends with its room's uploads (upload.go), not yet answered
	rate    ratelimit.Bucket
	// counterRate holds the member's CounterAdds to Limits.CounterAddsPerConn (counters.go):
	// here rather than in conn, whose every byte each idle connection pays.
	counterRate ratelimit.Bucket
	// moderateRate holds the member's ModerateRequests to moderatePerConn (moderate.go).
	moderateRate ratelimit.Bucket
	// attributeRate holds the member's SetAttributes to attributesPerConn (attributes.go).
	attributeRate ratelimit.Bucket
}

// takeRate takes a token at now from the connection's bucket that pick names, held to lim.
func (c *conn) takeRate(pick func(*connSends) *ratelimit.Bucket, lim ratelimit.Limit, now time.Time) (ok bool, retryAfter time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sends == nil {
		c.sends = new(connSends)
	}
	return pick(c.sends).Take(lim, now)
}

// addr returns the client's address; invalid when unknown.
func (c *conn) addr() netip.Addr {
	if c.addr16 == ([16]byte{}) {
		return netip.Addr{}
	}
	return netip.AddrFrom16(c.addr16).Unmap()
}

func (c *conn) getState() connState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// handle processes one frame from the client. data is not kept after handle returns.
//
// The work (decoding, a login's token check and bus round trip) runs on a short-lived goroutine
// while the connection's reader waits for it: the reader lives as long as the connection, and
// a goroutine's stack never shrinks below what its deepest call needed once, so keeping the
// reader's calls shallow keeps an idle connection's stack at the 2 KiB minimum instead of 4 or
// 8 KiB. Client frames are rare next to what the node writes, so the extra goroutine is cheap.
func (c *conn) handle(data []byte) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.handleFrame(data)
	}()
	<-done
}

func (c *conn) handleFrame(data []byte) {
	if c.closing.Load() {
		return
	}
	c.lastSeen.Store(c.node.now().UnixNano())
	if s, ok := decodeSendFrame(data); ok { // the frame read most often, read directly (sendframe.go)
		c.node.m.frameSend.Inc()
		if c.requireLive() {
			c.send(s)
		}
		return
	}
	var f clientpb.Frame
	if err := proto.Unmarshal(data, &f); err != nil || f.Kind == nil {
		c.node.m.frameBad.Inc()
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "frame does not parse")
		return
	}
	switch k := f.Kind.(type) {
	case *clientpb.Frame_Login:
		c.node.m.frameLogin.Inc()
		c.login(k.Login)
	case *clientpb.Frame_Send:
		c.node.m.frameSend.Inc()
		if c.requireLive() {
			c.send(k.Send)
		}
	case *clientpb.Frame_Heartbeat:
		c.node.m.frameHeartbeat.Inc()
		if c.requireLive() {
			c.heartbeat(k.Heartbeat)
		}
	case *clientpb.Frame_HistoryQuery:
		c.node.m.frameHistory.Inc()
		if c.requireLive() {
			c.queryHistory(k.HistoryQuery)
		}
	case *clientpb.Frame_Ack:
		c.node.m.framesIn.WithLabelValues("ack").Inc()
		if c.requireLive() {
			c.ack(k.Ack)
		}
	case *clientpb.Frame_QueueRequest:
		c.node.m.framesIn.WithLabelValues("queue").Inc() // rare: no child kept
		if c.requireLive() {
			c.queueRequest(k.QueueRequest) // queue.go
		}
	case *clientpb.Frame_ModerateRequest:
		c.node.m.framesIn.WithLabelValues("moderate").Inc() // rare: no child kept
		if c.requireLive() {
			c.moderate(k.ModerateRequest) // moderate.go
		}
	case *clientpb.Frame_CounterAdd:
		c.node.m.frameCounter.Inc()
		if c.requireLive() {
			c.counterAdd(k.CounterAdd) // counters.go
		}
	case *clientpb.Frame_SetAttribute:
		c.node.m.framesIn.WithLabelValues("set_attribute").Inc() // rare: no child kept
		if c.requireLive() {
			c.setAttribute(k.SetAttribute) // attributes.go
		}
	case *clientpb.Frame_RecallRequest:
		c.node.m.framesIn.WithLabelValues("recall").Inc() // rare: no child kept
		if c.requireLive() {
			c.recallRequest(k.RecallRequest) // recall.go
		}
	default:
		c.node.m.frameBad.Inc()
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "frame may only be sent by the server")
	}
}

// requireLive closes the connection unless it has logged in.
func (c *conn) requireLive() bool {
	if c.getState() == stateLive {
		return true
	}
	c.close(clientpb.CloseCode_CLOSE_CODE_NOT_LOGGED_IN, "log in first")
	return false
}

func (c *conn) login(l *clientpb.Login) {
	n := c.node
	c.mu.Lock()
	if c.state != stateNew {
		c.mu.Unlock()
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "already logged in")
		return
	}
	c.state = stateLoggingIn
	c.mu.Unlock()
	start := time.Now()
	loginCtx, span := tracing.Start(n.ctx, "chatlink login", trace.SpanKindServer)
	defer span.End()

	if n.draining.Load() {
		n.countLogin(c, start, "draining", clientpb.CloseCode_CLOSE_CODE_SHUTDOWN, "node is draining")
		c.close(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN, "node is draining")
		return
	}
	if n.conns.len() > n.cfg.MaxConnections {
		n.countLogin(c, start, "full", clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "node is full")
		c.close(clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "node is full")
		return
	}
	now := n.now()
	if limit, retry := n.limits.loginAddr(c.addr(), now); limit != "" {
		c.refuseLogin(limit, retry, now)
		return
	}
	claims, err := n.keys.Load().VerifyWithin(l.Token, n.cfg.MaxTokenLifetime)
	switch {
	case errors.Is(err, auth.ErrExpired):
		n.countLogin(c, start, "expired", clientpb.CloseCode_CLOSE_CODE_TOKEN_EXPIRED, "token expired")
		c.close(clientpb.CloseCode_CLOSE_CODE_TOKEN_EXPIRED, "token expired")
		return
	case errors.Is(err, auth.ErrLifetime):
		n.countLogin(c, start, "bad_token", clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, err.Error())
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, err.Error()) // the app's mistake, to be told
		return
	case err != nil:
		n.countLogin(c, start, "bad_token", clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, "token does not verify")
		n.sampledLog(now, "bad token", "addr", c.addr(), "err", err)
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, "token does not verify")
		return
	case len(l.Device) > 32 || len(l.RecoverSince) > 64:
		n.countLogin(c, start, "bad_frame", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "device or recover_since too long")
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "device or recover_since too long")
		return
	case l.ProtocolVersion > ProtocolVersion:
		n.countLogin(c, start, "bad_frame", clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, fmt.Sprintf("protocol version %d is not spoken here (%d is)", l.ProtocolVersion, ProtocolVersion))
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, fmt.Sprintf("protocol version %d is not spoken here (%d is)", l.ProtocolVersion, ProtocolVersion))
		return
	}
	if err := tag.Validate(claims.Tags); err != nil {
		n.countLogin(c, start, "bad_token", clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, err.Error())
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN, err.Error())
		return
	}
	c.app, c.room, c.uid, c.critical = claims.App, claims.Room, claims.UID, claims.Critical()
	c.liveState = l.LiveState
	if !n.limits.appAllows(c.app, c.addr()) {
		n.m.logins.WithLabelValues("denied").Inc()
		n.sampledLog(now, "address denied by the app's list", "addr", c.addr(), "app", c.app)
		c.close(clientpb.CloseCode_CLOSE_CODE_ADDRESS_DENIED, "address not allowed for this app")
		return
	}
	if limit, retry := n.limits.loginRoom(c.app, c.room, now); limit != "" {
		c.refuseLogin(limit, retry, now)
		return
	}
	// The pace comes after the token's check, which is cheap: a flood of bad tokens is refused
	// at once and takes no place in the queue from the clients that may log in.
	if ok, retry := n.pace.wait(n.ctx); !ok {
		if retry > 0 {
			c.refuseLogin(limitLoginNode, retry, n.now())
		}
		return
	}
	// A slot is freed as a login's requests are answered. The queue for them moves at the
	// services' pace (a dead node's clients all at once): a login waits as long as a client
	// gives a login (LoginTimeout), and fails as a join would after that.
	if !n.pace.enter(loginCtx, n.cfg.LoginTimeout) {
		n.countLogin(c, start, "unavailable", clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "node busy with other logins")
		c.close(clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "node busy with other logins")
		return
	}
	defer n.pace.leave()
	if c.getState() == stateClosed { // closed while it waited for the pace
		return
	}
	c.session = ids.SessionID(n.cfg.Node, n.sessionSeq.Add(1))
	c.device = l.Device
	c.loginMS = n.now().UnixMilli()

	// One login per room and node asks for the settings fresh from the store (the first to
	// arrive while the node has no member of the room); roomTable.join applies its answer.
	fresh := n.rooms.claimFresh(c.app, c.room)
	ctx, cancel := context.WithTimeout(loginCtx, n.cfg.RequestTimeout)
	var rep buspb.Reply
	err = n.request(ctx, busJoin, bus.SubjectRoomJoin, &buspb.JoinRequest{
		App: c.app, Room: c.room, Uid: c.uid, Node: n.cfg.Node, SessionId: c.session, Tags: claims.Tags,
		FirstOnNode: fresh, Device: c.device,
	}, &rep)
	cancel()
	if fresh && (err != nil || rep.Code != 0) {
		n.rooms.unclaimFresh(c.app, c.room) // the next login asks instead
	}
	switch {
	case err != nil:
		n.log.Warn("join failed", "session", c.session, "err", err)
		n.countLogin(c, start, "unavailable", clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "room service did not answer")
		c.close(clientpb.CloseCode_CLOSE_CODE_UNAVAILABLE, "room service did not answer")
		return
	case rep.Code != 0:
		n.countLogin(c, start, "refused", refusalCode(&rep), rep.Message)
		c.close(refusalCode(&rep), rep.Message) // banned, room closed or full (control.go)
		return
	}

	tags := claims.Tags
	if stored := rep.MemberTags; stored != nil { // the app server's word is the latest
		tags = stored.Tags
	}
	c.tags.Store(n.tags.Intern(tags))
	// The LoginAck is written as c joins the room's fan-out, under the room's lock: no Push of
	// the room can reach c before it. A login refused late (below) gets its Kick after it.
	var ack *clientpb.LoginAck
	r := n.rooms.join(c, rep.Settings, rep.Cdn, rep.Counters, viewerCountOf(rep.Viewers), rep.Attributes, fresh, func(r *localRoom) {
		ack = &clientpb.LoginAck{
			SessionId:           c.session,
			ServerTimeMs:        n.now().UnixMilli(),
			HeartbeatIntervalMs: uint32(n.cfg.HeartbeatInterval.Milliseconds()),
			App:                 c.app,
			Room:                c.room,
			Uid:                 c.uid,
			Node:                n.cfg.Node,
			Cdn:                 r.cdnConfig(),
			ProtocolVersion:     ProtocolVersion,
		}
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: ack}})
	})
	if rep.RecentRecalls != nil {
		r.recalls.stored(rep.RecentRecalls, n.now()) // recall.go
	}
	c.mu.Lock()
	if c.state == stateClosed {
		// The client went away while the room service answered: undo the join.
		c.mu.Unlock()
		c.leave()
		return
	}
	c.state = stateLive
	c.mu.Unlock()
	if n.refusedLate(c) { // a ban or close that raced this login (control.go)
		return
	}

	n.countLogin(c, start, "ok", 0, "")
	now = n.now()
	c.afterLoginAck(r, ack.Cdn)
	n.memberNotice(c, r, false) // viewers.go
	switch ask := askOf(l); {
	case ask.since != "" && !checkSince(ask.since, now):
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_RECOVER_SINCE), Message: "recover_since is not a message id",
		}}})
	case ask.wanted():
		ask.keep, ask.age = r.fanout.historyRetention()
		n.goAsync(func() { n.recoverHistory(c, ask) })
	}
	if l.Inbox {
		n.deliverInbox(c) // queues the read: inboxLoop makes it
	}
	n.presence.add(c, c.sessionEvent(buspb.SessionEvent_KIND_LOGIN, c.loginMS), span.SpanContext())
}

// heartbeat answers a Heartbeat with the interval the client should use from now: it grows
// while the client beats on time and falls back to the base after a late beat. A longer
// interval means fewer wake-ups for a mobile client and fewer frames for the node.
func (c *conn) heartbeat(h *clientpb.Heartbeat) {
	cfg := &c.node.cfg
	now := cfg.Now()
	interval := time.Duration(c.hbInterval.Load()) * time.Millisecond
	if c.lastBeat != 0 && now.UnixNano()-c.lastBeat > int64(interval*3/2) {
		interval, c.beatsOnTime = cfg.HeartbeatInterval, 0
	} else if c.beatsOnTime++; c.beatsOnTime >= 3 {
		interval, c.beatsOnTime = min(cfg.HeartbeatMax, interval+cfg.HeartbeatStep), 0
	}
	c.lastBeat = now.UnixNano()
	c.hbInterval.Store(uint32(interval.Milliseconds()))
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_HeartbeatAck{HeartbeatAck: &clientpb.HeartbeatAck{
		ClientTimeMs:        h.ClientTimeMs,
		ServerTimeMs:        now.UnixMilli(),
		HeartbeatIntervalMs: uint32(interval.Milliseconds()),
	}}})
}

// send queues a client's Send: with its room's sends on the node, which go to the room service
// a window at a time (upload.go), or, with a negative SendWindow, on its own, forwarded by one
// goroutine per connection, started when sends wait, one at a time. Either way a client's
// messages keep the order it sent them in.
func (c *conn) send(s *clientpb.Send) {
	n := c.node
	c.mu.Lock()
	if c.sends == nil {
		c.sends = new(connSends)
	}
	if len(c.sends.q)+c.sends.waiting >= n.cfg.MaxInflightSends {
		c.mu.Unlock()
		c.sendError(s.Seq, clientpb.ErrorCode_ERROR_CODE_RATE_LIMITED, "too many sends waiting for an answer")
		return
	}
	if limit, retry := n.limits.send(c, n.now()); limit != "" {
		c.mu.Unlock()
		n.limitHit(limit, c, n.now())
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED), Message: "over the " + limit + " rate",
			Seq: s.Seq, RetryAfterMs: ratelimit.Millis(retry),
		}}})
		n.m.sendErrors.WithLabelValues(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED.String()).Inc()
		return
	}
	if n.cfg.SendWindow > 0 {
		c.sends.waiting++
		c.mu.Unlock()
		n.uploads.add(c, s)
		return
	}
	c.sends.q = append(c.sends.q, s)
	start := !c.sending
	c.sending = true
	c.mu.Unlock()
	if start {
		n.goAsync(c.sendLoop)
	}
}

func (c *conn) sendLoop() {
	for {
		c.mu.Lock()
		if len(c.sends.q) == 0 || c.state == stateClosed {
			c.sends.q, c.sending = nil, false
			c.mu.Unlock()
			return
		}
		s := c.sends.q[0]
		c.sends.q[0] = nil
		c.sends.q = c.sends.q[1:]
		c.mu.Unlock()
		c.forward(s)
	}
}

// forward asks the room service to take s and answers the client.
func (c *conn) forward(s *clientpb.Send) {
	n := c.node
	ctx, span := tracing.Start(n.ctx, "chatlink send", trace.SpanKindServer)
	defer span.End() // after the SendAck or the Error is written
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	var rep buspb.Reply
	err := n.request(ctx, busSend, bus.SubjectRoomSend, &buspb.SendRequest{
		App: c.app, Room: c.room, Uid: c.uid, SessionId: c.session,
		Type: s.Type, Lane: s.Lane, Body: s.Body, TagExpr: s.TagExpr, SenderTags: c.tagList(),
		CriticalGranted: c.critical,
	}, &rep)
	switch {
	case err != nil:
		c.sendError(s.Seq, clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, "room service did not answer")
	case rep.Code != 0:
		// A refusal by the room's member send rates carries its retry hint.
		c.node.m.sendErrors.WithLabelValues(clientpb.ErrorCode(rep.Code).String()).Inc()
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: rep.Code, Message: rep.Message, Seq: s.Seq, RetryAfterMs: rep.RetryAfterMs,
		}}})
	default:
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{
			Seq: s.Seq, MessageId: rep.MessageId, ServerTimeMs: rep.ServerTimeMs,
		}}})
	}
}

// refuseLogin tells the client which rate its login is over and when to come back, then
// closes the connection with 4013.
func (c *conn) refuseLogin(limit string, retry time.Duration, now time.Time) {
	n := c.node
	n.m.logins.WithLabelValues("rate_limited").Inc()
	n.limitHit(limit, c, now)
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
		Code: uint32(clientpb.ErrorCode_ERROR_CODE_LOGIN_RATE_LIMITED), Message: "over the " + limit + " rate",
		RetryAfterMs: ratelimit.Millis(retry),
	}}})
	c.closeKick(&clientpb.Kick{Code: uint32(clientpb.CloseCode_CLOSE_CODE_LOGIN_RATE_LIMITED),
		Reason: "over the " + limit + " rate", RetryAfterMs: ratelimit.Millis(retry)})
}

func (c *conn) sendError(seq uint64, code clientpb.ErrorCode, msg string) {
	c.node.m.sendErrors.WithLabelValues(code.String()).Inc()
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{Code: uint32(code), Message: msg, Seq: seq}}})
}

// write queues an encoded frame.
func (c *conn) write(b []byte) { c.t.write(b) }

// closeSlow closes a connection whose backlog grew past the limit even for critical messages.
// It is not reading, so the Kick is unlikely to arrive: the socket is closed at once.
func (c *conn) closeSlow() {
	c.close(clientpb.CloseCode_CLOSE_CODE_SLOW_READER, "not reading fast enough")
	c.t.forceClose()
}

func (c *conn) writeFrame(f *clientpb.Frame) {
	b, err := proto.Marshal(f)
	if err != nil {
		c.node.log.Error("encode frame", "err", err)
		return
	}
	c.t.write(b)
}

// close sends a Kick with code and closes the connection; later frames from the client are
// ignored. Only the first call has an effect.
func (c *conn) close(code clientpb.CloseCode, reason string) {
	c.closeKick(&clientpb.Kick{Code: uint32(code), Reason: reason})
}

// closeKick is close with a Kick that says more (a retry hint).
func (c *conn) closeKick(k *clientpb.Kick) {
	if !c.closing.CompareAndSwap(false, true) {
		return
	}
	code := clientpb.CloseCode(k.Code)
	c.node.m.closes.WithLabelValues(code.String()).Inc()
	b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Kick{Kick: k}})
	c.t.kick(code, b)
}

// closed is called exactly once by the transport when the connection is gone.
func (c *conn) closed() {
	c.mu.Lock()
	prev := c.state
	c.state = stateClosed
	c.mu.Unlock()
	n := c.node
	n.conns.remove(c)
	n.m.connections.Dec()
	n.limits.closed(c.addr())
	if prev != stateLive {
		return // a login in progress undoes its own join
	}
	c.leave()
}

// leave takes a closed member out of its room and ends its session. Once the state is
// closed, setTags no longer swaps the tags, so they are released here exactly once.
func (c *conn) leave() {
	n := c.node
	r := n.rooms.lookup(c.app, c.room)
	n.rooms.leave(c)
	if r != nil {
		n.memberNotice(c, r, true) // viewers.go
	}
	if set := c.tags.Swap(nil); set != nil {
		n.tags.Release(set)
	}
	n.presence.add(c, c.sessionEvent(buspb.SessionEvent_KIND_LOGOUT, n.now().UnixMilli()), trace.SpanContext{})
}

// setTags gives a live member new tags; its next tick's messages are chosen by them. It
// reports whether the member was live.
func (c *conn) setTags(tags []string) bool {
	c.mu.Lock()
	if c.state != stateLive {
		c.mu.Unlock()
		return false
	}
	if old := c.tags.Swap(c.node.tags.Intern(tags)); old != nil {
		c.node.tags.Release(old)
	}
	c.mu.Unlock()
	c.node.rooms.retag(c) // after c.mu: the room's lock comes before a member's
	return true
}

// tagList returns the member's tags (none once it has closed).
func (c *conn) tagList() []string {
	if set := c.tags.Load(); set != nil {
		return set.Tags
	}
	return nil
}

// sessionEvent describes the session for the node's session stream, from which presence and
// the room service (members per room and node) learn it.
func (c *conn) sessionEvent(kind buspb.SessionEvent_Kind, ms int64) *buspb.SessionEvent {
	return &buspb.SessionEvent{
		Kind: kind, App: c.app, Uid: c.uid, Room: c.room,
		Node: c.node.cfg.Node, SessionId: c.session, Device: c.device, TimeMs: ms,
	}
}
