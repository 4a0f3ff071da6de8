package sdk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// conn is one logged-in connection to a ChatLink: a Client has one at a time (two for a moment
// while it moves).
//
// A conn runs two goroutines, both of which close waits for: a reader that answers Sends and
// hands pushes to the Client's delivery, and a heartbeat sender that also notices a silent
// server.
type conn struct {
	cfg   *Config
	log   *slog.Logger
	fc    frameConn
	ep    Endpoint
	gen   uint64 // numbers the Client's connections; the delivery listens to the latest
	d     *delivery
	cdn   *cdnPoller
	login *clientpb.Login
	ack   *clientpb.LoginAck // set before connect returns it, then read-only
	since time.Time          // when the login succeeded

	onLogin     func(*conn)              // when set, takes the connection at its LoginAck (connect)
	loginAck    chan *clientpb.LoginAck  // reader -> connect, at most one value
	moves       chan *clientpb.Reconnect // reader -> the Client, at most one value
	reconnected bool                     // for the ConnectedEvent

	loggedIn  atomic.Bool
	nextSeq   atomic.Uint64
	lastFrame atomic.Int64 // when the last frame arrived, unix nanoseconds
	interval  atomic.Int64 // heartbeat interval, nanoseconds

	done chan struct{} // closed when the connection has ended; err is set by then
	wg   sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	err     error
	kick    *clientpb.Kick             // the Kick that ended the connection, if one did
	hint    time.Duration              // retry_after_ms of an Error before the LoginAck (121 before a Kick 4013)
	pending map[uint64]chan sendResult // Sends, HistoryQueries and queue requests waiting for their answer, by seq
	adopted bool                       // onLogin has the connection: connect no longer ends it
	left    bool                       // a move left this connection: new requests go to the next one
	settled chan struct{}              // closed when pending empties, while leave waits for it
	adds    [counterRing]sentAdd       // the last CounterAdds sent, by seq % counterRing (counters.go)
}

// errLeft refuses a request on a connection a move has left, before any of it was written: the
// Client makes it again on the connection it moved to.
var errLeft = fmt.Errorf("%w (the request was not sent)", ErrMoved)

// sendResult answers a Send (ack or err), a HistoryQuery (page or err), a queue request (queue),
// a moderate request (moderate), a SetAttribute (attr) or a recall (recall).
type sendResult struct {
	ack      *clientpb.SendAck
	page     *clientpb.HistoryPage
	queue    *clientpb.RoomQueueReply
	moderate *clientpb.ModerateReply
	attr     *clientpb.SetAttributeReply
	recall   *clientpb.RecallReply
	err      error
}

// Outgoing is a message to Send.
type Outgoing struct {
	// Type is app-defined, e.g. "chat" or "gift"; at most 32 bytes.
	Type string
	// Lane is the message's priority class. LANE_UNSPECIFIED means LANE_NORMAL.
	Lane clientpb.Lane
	// Body must not be empty and may be at most 16,384 bytes.
	Body []byte
	// TagExpr, if not empty, limits delivery to members whose tags satisfy it.
	TagExpr string
}

// connect dials ep and logs in with login. On success the conn's goroutines are running and its
// pushes go to d.
func connect(ctx context.Context, cfg *Config, d *delivery, cdn *cdnPoller, ep Endpoint, gen uint64, login *clientpb.Login, reconnected bool, onLogin func(*conn)) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
	defer cancel()
	fc, err := dialTransport(ctx, cfg, ep)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect: %w", ctx.Err())
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	c := &conn{
		cfg: cfg, log: cfg.Logger, fc: fc, ep: ep, gen: gen, d: d, cdn: cdn, login: login, reconnected: reconnected,
		loginAck: make(chan *clientpb.LoginAck, 1),
		moves:    make(chan *clientpb.Reconnect, 1),
		done:     make(chan struct{}),
		pending:  make(map[uint64]chan sendResult),
		onLogin:  onLogin,
	}
	c.lastFrame.Store(time.Now().UnixNano())
	c.wg.Add(1)
	go c.readLoop()

	if err := c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: login}}); err != nil {
		c.close(err)
		return nil, fmt.Errorf("login: %w", err)
	}
	select {
	case ack := <-c.loginAck:
		c.start(ack)
		return c, nil
	case <-c.done:
		select {
		case ack := <-c.loginAck:
			// Logged in, then closed at once (a kick right after the LoginAck): the login
			// succeeded, and the Client learns of the close like of any later one.
			c.start(ack)
			return c, nil
		default:
		}
		c.wg.Wait()
		return nil, fmt.Errorf("login: %w", c.Err())
	case <-ctx.Done():
		if c.failUnlessAdopted(ctx.Err()) {
			// The LoginAck came first, and onLogin has the connection: it logged in.
			c.start(<-c.loginAck)
			return c, nil
		}
		c.wg.Wait()
		return nil, fmt.Errorf("login: %w", ctx.Err())
	}
}

// failUnlessAdopted ends a connection that is still logging in with err, and reports false;
// or, when onLogin has taken the connection already, leaves it up and reports true.
func (c *conn) failUnlessAdopted(err error) (adopted bool) {
	c.mu.Lock()
	if c.adopted {
		c.mu.Unlock()
		return true
	}
	ended := c.endLocked(err) // under the lock loggedInWith adopts under: one or the other
	c.mu.Unlock()
	if ended {
		c.fc.close()
	}
	return false
}

// start runs the heartbeats of a logged-in conn.
func (c *conn) start(ack *clientpb.LoginAck) {
	c.ack = ack
	c.since = time.Now()
	c.setInterval(ack.GetHeartbeatIntervalMs())
	c.wg.Add(1)
	go c.heartbeatLoop()
}

// Err returns why the connection ended, or nil while it is up.
func (c *conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// kicked returns the Kick that ended the connection, if one did.
func (c *conn) kicked() *clientpb.Kick {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kick
}

// close ends the connection with err (unless it has ended) and waits for its goroutines.
func (c *conn) close(err error) {
	c.fail(err)
	c.wg.Wait()
}

// fail ends the connection with err, unless it has already ended. Pending Sends return err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	ended := c.endLocked(err)
	c.mu.Unlock()
	if ended {
		c.fc.close()
	}
}

// endLocked marks the connection ended with err, unless it has ended, and reports whether it
// did; the caller then closes fc. c.mu is held.
func (c *conn) endLocked(err error) bool {
	if c.err != nil {
		return false
	}
	c.err = err
	close(c.done)
	return true
}

// forget drops the request with seq from pending, and tells leave when none is left.
func (c *conn) forget(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, seq)
	if len(c.pending) == 0 && c.settled != nil {
		close(c.settled)
		c.settled = nil
	}
}

// leave ends a connection a move has left, with ErrMoved. Requests made from now on are
// refused with errLeft (the Client makes them on the new connection); those already sent get
// their answers first, for up to wait or until ctx ends, since the node that asked for the
// move still serves them while it drains.
func (c *conn) leave(ctx context.Context, wait time.Duration) {
	c.mu.Lock()
	c.left = true
	var settled chan struct{}
	if len(c.pending) > 0 {
		settled = make(chan struct{})
		c.settled = settled
	}
	c.mu.Unlock()
	if settled != nil {
		t := time.NewTimer(wait)
		select {
		case <-settled:
		case <-c.done:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	c.close(ErrMoved)
}

// send sends m and waits for the server's answer.
func (c *conn) send(ctx context.Context, m Outgoing) (*clientpb.SendAck, error) {
	r := c.request(ctx, "send", func(seq uint64) *clientpb.Frame {
		return &clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
			Seq: seq, Type: m.Type, Lane: m.Lane, Body: m.Body, TagExpr: m.TagExpr,
		}}}
	})
	return r.ack, r.err
}

// queryHistory sends q and waits for the server's answer.
func (c *conn) queryHistory(ctx context.Context, q HistoryQuery) (*clientpb.HistoryPage, error) {
	r := c.request(ctx, "history", func(seq uint64) *clientpb.Frame {
		return &clientpb.Frame{Kind: &clientpb.Frame_HistoryQuery{HistoryQuery: q.frame(seq)}}
	})
	var refused *SendError
	if errors.As(r.err, &refused) {
		return nil, &HistoryError{Code: refused.Code, Message: refused.Message}
	}
	return r.page, r.err
}

// request sends the frame made for the next seq and waits for the answer with that seq. what
// names the request in errors.
func (c *conn) request(ctx context.Context, what string, frame func(seq uint64) *clientpb.Frame) sendResult {
	seq := c.nextSeq.Add(1)
	answer := make(chan sendResult, 1)
	c.mu.Lock()
	if c.left {
		c.mu.Unlock()
		return sendResult{err: errLeft}
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return sendResult{err: fmt.Errorf("roomcast: %s: %w", what, err)}
	}
	c.pending[seq] = answer
	c.mu.Unlock()
	defer c.forget(seq)

	if err := c.writeFrame(frame(seq)); err != nil {
		return sendResult{err: fmt.Errorf("roomcast: %s: %w", what, err)}
	}
	select {
	case r := <-answer:
		return r
	case <-ctx.Done():
		return sendResult{err: fmt.Errorf("roomcast: %s: %w", what, ctx.Err())}
	case <-c.done:
		select {
		case r := <-answer: // answered just before the end
			return r
		default:
			return sendResult{err: fmt.Errorf("roomcast: %s: %w", what, c.Err())}
		}
	}
}

// writeFrame sends f. A frame over MaxFrameSize is refused without harm to the connection; a
// failed write ends the connection.
func (c *conn) writeFrame(f *clientpb.Frame) error {
	if n := proto.Size(f); n > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, MaxFrameSize)
	}
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if err := c.fc.write(f); err != nil {
		c.fail(fmt.Errorf("roomcast: write: %w", err))
		return c.Err()
	}
	return nil
}

// readLoop runs the transport's reader until the connection ends.
func (c *conn) readLoop() {
	defer c.wg.Done()
	err := c.fc.serve(c.handleFrame)
	c.fail(err)
}

// handleFrame acts on one frame from the server. It runs on the reader goroutine and never
// blocks: pushes go to the delivery's queue.
func (c *conn) handleFrame(f *clientpb.Frame) {
	select {
	case <-c.done:
		return // frames still buffered after the end
	default:
	}
	c.lastFrame.Store(time.Now().UnixNano())

	loggedIn := c.loggedIn.Load()
	switch k := f.Kind.(type) {
	case *clientpb.Frame_LoginAck:
		c.loggedInWith(k.LoginAck)
		return
	case *clientpb.Frame_Kick:
		c.mu.Lock()
		c.kick = k.Kick
		hint := c.hint
		c.mu.Unlock()
		ce := &CloseError{Code: k.Kick.GetCode(), Reason: k.Kick.GetReason()}
		if ce.Limited() {
			// A server older than Kick.retry_after_ms said it only in the Error before.
			ce.RetryAfter = cmp.Or(time.Duration(k.Kick.GetRetryAfterMs())*time.Millisecond, hint)
		}
		c.fail(ce)
		return
	case *clientpb.Frame_Error:
		if !loggedIn && k.Error.GetSeq() == 0 {
			// The reason for the Kick that follows (121 LOGIN_RATE_LIMITED); the Kick ends it.
			c.mu.Lock()
			c.hint = time.Duration(k.Error.GetRetryAfterMs()) * time.Millisecond
			c.mu.Unlock()
			return
		}
	case *clientpb.Frame_Reconnect:
		c.log.Info("roomcast: server asks to reconnect",
			"node", c.ep.Node, "delay_ms", k.Reconnect.GetDelayMs(), "reason", k.Reconnect.GetReason())
		select {
		case c.moves <- k.Reconnect:
		default: // asked already
		}
		return
	case nil:
		return // a frame kind newer than this SDK
	}
	if !loggedIn {
		c.fail(fmt.Errorf("%w: %T before LoginAck", ErrProtocol, f.Kind))
		return
	}
	switch k := f.Kind.(type) {
	case *clientpb.Frame_SendAck:
		c.answer(k.SendAck.GetSeq(), sendResult{ack: k.SendAck})
	case *clientpb.Frame_HistoryPage:
		c.answer(k.HistoryPage.GetSeq(), sendResult{page: k.HistoryPage})
	case *clientpb.Frame_QueueReply:
		c.answer(k.QueueReply.GetSeq(), sendResult{queue: k.QueueReply})
	case *clientpb.Frame_ModerateReply:
		c.answer(k.ModerateReply.GetSeq(), sendResult{moderate: k.ModerateReply})
	case *clientpb.Frame_SetAttributeReply:
		c.answer(k.SetAttributeReply.GetSeq(), sendResult{attr: k.SetAttributeReply})
	case *clientpb.Frame_RecallReply:
		c.answer(k.RecallReply.GetSeq(), sendResult{recall: k.RecallReply}) // recall.go
	case *clientpb.Frame_Recall:
		c.d.recall(k.Recall) // recall.go
	case *clientpb.Frame_Error:
		e := k.Error
		if e.GetCode() == uint32(clientpb.ErrorCode_ERROR_CODE_ACK_FAILED) {
			c.log.Warn("roomcast: acknowledgement not applied: the messages come again after the next login", "message", e.GetMessage())
			return
		}
		if e.GetSeq() == 0 { // the answer to the login's history request
			c.log.Warn("roomcast: history not sent", "code", e.GetCode(), "message", e.GetMessage())
			err := error(sendError(e))
			if e.GetCode() == uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE) {
				err = fmt.Errorf("%w: %s", ErrHistoryUnavailable, e.GetMessage())
			}
			c.d.historyFailed(c.gen, err)
			return
		}
		if c.refusedAdd(e) { // counters.go
			return
		}
		c.answer(e.GetSeq(), sendResult{err: sendError(e)})
	case *clientpb.Frame_CounterTotals:
		c.d.counters(k.CounterTotals)
	case *clientpb.Frame_ViewerCount:
		c.d.viewerCount(k.ViewerCount) // viewers.go
	case *clientpb.Frame_MemberNotice:
		c.d.memberNotice(k.MemberNotice)
	case *clientpb.Frame_RoomAttributes:
		c.d.attributes(k.RoomAttributes) // attributes.go
	case *clientpb.Frame_Push:
		if !c.d.push(c.gen, k.Push) {
			c.fail(ErrSlowConsumer)
		}
	case *clientpb.Frame_HeartbeatAck:
		c.setInterval(k.HeartbeatAck.GetHeartbeatIntervalMs())
	case *clientpb.Frame_CdnConfig:
		c.cdn.update(c.gen, k.CdnConfig)
	default:
		c.fail(fmt.Errorf("%w: the server sent a client frame %T", ErrProtocol, f.Kind))
	}
}

// loggedInWith takes the LoginAck: a second one, or one of a protocol version this SDK does not
// speak, ends the connection.
func (c *conn) loggedInWith(ack *clientpb.LoginAck) {
	if v := ack.GetProtocolVersion(); v > ProtocolVersion {
		c.fail(fmt.Errorf("%w: the server speaks protocol version %d, this SDK %d", ErrVersion, v, ProtocolVersion))
		return
	}
	if !c.loggedIn.CompareAndSwap(false, true) {
		c.fail(fmt.Errorf("%w: a second LoginAck", ErrProtocol))
		return
	}
	// The Client (onLogin) and the delivery switch to this connection before any of its
	// events and pushes, which follow on this goroutine.
	if c.onLogin != nil {
		c.mu.Lock()
		if c.err != nil { // connect gave up on it (its attempt timed out)
			c.mu.Unlock()
			return
		}
		c.adopted = true
		c.onLogin(c)
		c.mu.Unlock()
	}
	c.d.loggedIn(c.gen, &ConnectedEvent{LoginAck: ack, Endpoint: c.ep, Reconnected: c.reconnected}, c.login)
	c.cdn.login(c.gen, ack, time.Now())
	c.loginAck <- ack
}

// answer hands r to the Send or HistoryQuery waiting for seq, if it still waits.
func (c *conn) answer(seq uint64, r sendResult) {
	c.mu.Lock()
	ch := c.pending[seq]
	c.mu.Unlock()
	if ch != nil {
		ch <- r // buffered, and answered at most once (this goroutine forgets seq next)
	}
	c.forget(seq) // after the answer is in: leave may close the connection once pending empties
}

func (c *conn) setInterval(ms uint32) {
	if ms == 0 {
		if c.interval.Load() != 0 {
			return // keep the interval we have
		}
		c.interval.Store(int64(defaultHeartbeatInterval))
		if c.cfg.HeartbeatInterval > 0 {
			c.interval.Store(int64(max(min(defaultHeartbeatInterval, c.cfg.HeartbeatInterval), minHeartbeatInterval)))
		}
		return
	}
	interval := time.Duration(ms) * time.Millisecond
	if c.cfg.HeartbeatInterval > 0 {
		interval = min(interval, c.cfg.HeartbeatInterval)
	}
	c.interval.Store(int64(max(interval, minHeartbeatInterval)))
}

// heartbeatLoop sends a Heartbeat every interval and ends the connection with ErrServerTimeout
// when nothing has arrived for three intervals (the server answers every Heartbeat, so a live
// server is never silent that long).
func (c *conn) heartbeatLoop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	nextBeat := time.Now().Add(time.Duration(c.interval.Load()))
	for {
		interval := time.Duration(c.interval.Load())
		deadline := time.Unix(0, c.lastFrame.Load()).Add(3 * interval)
		timer.Reset(time.Until(earliest(nextBeat, deadline)))
		select {
		case <-c.done:
			return
		case <-timer.C:
		}
		now := time.Now()
		interval = time.Duration(c.interval.Load())
		if now.Sub(time.Unix(0, c.lastFrame.Load())) >= 3*interval {
			c.fail(ErrServerTimeout)
			return
		}
		if !now.Before(nextBeat) {
			hb := &clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{
				ClientTimeMs: now.UnixMilli(),
			}}}
			if err := c.writeFrame(hb); err != nil {
				return // writeFrame ended the connection
			}
			nextBeat = now.Add(interval)
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// terminal reports whether err ends the search for a working endpoint and the reconnecting: a
// terminal close code means every ChatLink would refuse the same login.
func terminal(err error) bool {
	var ce *CloseError
	return errors.As(err, &ce) && ce.Terminal()
}
