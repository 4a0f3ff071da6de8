package sdk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// Client is a member's connection to its room that stays up: after a transient close, an error
// or the server's Reconnect it dispatches again and logs in elsewhere, with backoff and
// jitter, and recovers what it missed. Its methods are safe for concurrent use.
//
// A Client runs two goroutines besides its connection's, all of which Close waits for: a
// supervisor that reconnects, and a callback goroutine that calls Config.OnMessage and
// Config.OnEvent in order; and two more from the first time its room is in CDN mode: a poller
// of the room's segments and a player that hands messages on at their play time.
type Client struct {
	cfg    Config
	log    *slog.Logger
	d      *delivery
	cdn    *cdnPoller
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	gens   atomic.Uint64 // numbers the connections
	closed atomic.Bool   // Close was called: queued messages are dropped
	done   chan struct{} // closed when the Client has stopped; err is set by then
	wg     sync.WaitGroup

	mu     sync.Mutex    // guards the fields below
	cur    *conn         // the live connection; nil while reconnecting
	ready  chan struct{} // closed when cur is set
	last   *conn         // the latest connection that logged in
	err    error
	paused bool // Pause was called, Resume not yet

	wake chan struct{} // one value: Reconnect, Pause or Resume was called (lifecycle.go)
}

// Dial finds a ChatLink, connects and logs in, and returns the Client once the LoginAck
// arrived. It tries the endpoints from Config.Endpoints, or else from the dispatcher, in order:
// a failed connection, a timeout (Config.AttemptTimeout) or a transient close code moves on to
// the next endpoint; a terminal close code (4000–4499, a *CloseError) is returned at once,
// because another ChatLink would refuse the same token too. If none works Dial returns the
// errors; it does not retry, but for a login refused for now (4013 LOGIN_RATE_LIMITED,
// 4015 TOO_MANY_CONNECTIONS): then it waits the server's retry hint plus jitter (a
// LimitedEvent) and tries again, until ctx ends.
//
// ctx bounds only the dialing and login. From then on the Client reconnects by itself (unless
// Config.NoReconnect) until Close or a terminal close code.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), ready: make(chan struct{}), wake: make(chan struct{}, 1)}
	c.d = newDelivery(&c.cfg)
	c.cdn = newCdnPoller(&c.cfg, c.d)
	login := c.newLogin(cfg.RecoverSince, 0, uint32(min(max(0, cfg.History), maxHistory)))
	first, err := c.establish(ctx, login, false, "", nil)
	for attempt := 1; err != nil && ctx.Err() == nil; attempt++ {
		delay, ok := c.limitedDelay(err, attempt)
		if !ok {
			break
		}
		if serr := sleep(ctx, delay); serr != nil {
			err = errors.Join(err, serr)
			break
		}
		first, err = c.establish(ctx, login, false, "", nil)
	}
	if err != nil {
		c.cdn.stop()                      // a login that ended at once may have started polling
		c.d.close(&ClosedEvent{Err: err}) // and a hold
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.adopt(first)
	c.wg.Add(2)
	go c.run(first)
	go c.callbacks()
	return c, nil
}

func (c *Client) newLogin(since string, sinceSeq uint64, history uint32) *clientpb.Login {
	return &clientpb.Login{
		Token: c.cfg.Token, Device: c.cfg.Device, Client: ClientName, ProtocolVersion: ProtocolVersion,
		RecoverSince: since, RecoverSinceRoomSeq: sinceSeq, History: history,
		Inbox:     true, // the callbacks acknowledge at-least-once messages (inbox.go)
		LiveState: true, // viewer counts, member notices, room attributes (viewers.go, attributes.go)
	}
}

// establish tries the endpoints in order, those of node leaving (when set) last, and returns the
// first connection that logged in. onLogin, when set, gets that connection when its LoginAck
// arrives, before any of its events reach the callbacks (see connect).
func (c *Client) establish(ctx context.Context, login *clientpb.Login, reconnected bool, leaving string, onLogin func(*conn)) (*conn, error) {
	endpoints := c.cfg.Endpoints
	if len(endpoints) == 0 {
		var err error
		if endpoints, err = dispatchToken(ctx, c.cfg.HTTPClient, c.cfg.closeDispatch, c.cfg.Dispatcher, c.cfg.Token); err != nil {
			return nil, err
		}
	}
	if leaving != "" {
		// The node being left goes last (a dispatcher may not know yet that it drains).
		endpoints = slices.Clone(endpoints)
		slices.SortStableFunc(endpoints, func(a, b Endpoint) int { return cmp.Compare(boolInt(a.Node == leaving), boolInt(b.Node == leaving)) })
	}
	var errs []error
	for _, ep := range endpoints {
		cn, err := connect(ctx, &c.cfg, c.d, c.cdn, ep, c.gens.Add(1), login, reconnected, onLogin)
		if err == nil {
			return cn, nil
		}
		err = fmt.Errorf("roomcast: %s %s: %w", ep.Node, endpointAddr(ep, c.cfg.Transport), err)
		if ctx.Err() != nil || terminal(err) {
			return nil, err
		}
		c.log.Debug("roomcast: endpoint failed, trying the next", "node", ep.Node, "err", err)
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// adopt makes cn the live connection.
func (c *Client) adopt(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil { // else a move: ready is closed already
		close(c.ready)
	}
	c.cur, c.last = cn, cn
}

// lose marks the live connection gone: Sends wait for the next.
func (c *Client) lose() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		c.cur, c.ready = nil, make(chan struct{})
	}
}

// run keeps the Client connected until Close, a terminal close code, or (with NoReconnect) the
// end of its connection.
func (c *Client) run(cur *conn) {
	defer c.wg.Done()
	attempt := 0
	for {
		select {
		case <-c.ctx.Done():
			cur.close(ErrClosed)
			c.finish(ErrClosed)
			return
		case r := <-cur.moves:
			if c.cfg.NoReconnect {
				continue // the connection ends when the node has drained
			}
			if next := c.move(cur, r); next != nil {
				cur = next
			}
			continue
		case <-cur.done:
		}
		err := cur.Err()
		cur.close(err) // wait for its goroutines
		c.lose()
		if k := cur.kicked(); k != nil {
			c.d.event(&KickedEvent{Code: k.GetCode(), Reason: k.GetReason(), Terminal: terminal(err)})
		} else if ce := (*CloseError)(nil); !errors.As(err, &ce) && !byApp(err) {
			c.d.event(&ErrorEvent{Err: err})
		}
		if c.cfg.NoReconnect || terminal(err) {
			c.finish(err)
			return
		}
		if time.Since(cur.since) >= c.cfg.StableAfter || byApp(err) {
			attempt = 0
		}
		next, err := c.reconnect(&attempt, err)
		if next == nil {
			c.finish(err)
			return
		}
		cur = next
	}
}

// reconnect waits with backoff and connects again, until it succeeds, Close is called or the
// server refuses the login for good. reason is why the last connection ended.
func (c *Client) reconnect(attempt *int, reason error) (*conn, error) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	select { // a wake before now is for this reconnect: it happened
	case <-c.wake:
	default:
	}
	for {
		if c.Paused() {
			c.d.event(&ReconnectingEvent{Attempt: 0, Err: ErrPaused})
			if !c.waitResumed() {
				return nil, ErrClosed
			}
			*attempt, reason = 0, ErrPaused
		}
		*attempt++
		delay, limited := c.limitedDelay(reason, *attempt)
		switch {
		case limited:
		case byApp(reason) && *attempt == 1:
			delay = 0 // the app says the network is there (again)
		default:
			delay = c.backoff(*attempt)
		}
		if !c.Paused() {
			c.d.event(&ReconnectingEvent{Attempt: *attempt, Delay: delay, Err: reason})
		}
		timer.Reset(delay)
		select {
		case <-c.ctx.Done():
			return nil, ErrClosed
		case <-timer.C:
		case <-c.wake: // the network changed, or a Pause or Resume: try now, or pause
			timer.Stop()
			if !c.Paused() {
				reason, *attempt = ErrNetworkChanged, 0
			}
			continue
		}
		since, seq := c.d.recoverFrom()
		next, err := c.establish(c.ctx, c.newLogin(since, seq, 0), true, "", nil)
		switch {
		case err == nil && c.Paused():
			next.close(ErrPaused) // paused while it logged in
			continue
		case err == nil:
			c.adopt(next)
			return next, nil
		case c.ctx.Err() != nil:
			return nil, ErrClosed
		}
		c.d.event(&ErrorEvent{Err: err})
		if terminal(err) {
			return nil, err
		}
		reason = err
	}
}

// backoff returns the wait before the attempt-th reconnect: a ceiling that doubles from
// Config.ReconnectMinDelay up to ReconnectMaxDelay, half of it fixed and half random ("equal
// jitter"), so that a room's clients spread out but none retries at once.
func (c *Client) backoff(attempt int) time.Duration {
	ceiling := c.ceiling(attempt)
	return ceiling/2 + rand.N(ceiling/2+1)
}

// ceiling is the longest wait before the attempt-th reconnect.
func (c *Client) ceiling(attempt int) time.Duration {
	if attempt >= 30 {
		return c.cfg.ReconnectMaxDelay
	}
	return min(c.cfg.ReconnectMaxDelay, c.cfg.ReconnectMinDelay<<(attempt-1))
}

// limitedDelay is the wait before the attempt-th login after err, when err is a login the
// server refused for now with a retry hint (4013, 4015; a *CloseError with RetryAfter): the
// hint plus a random part up to the backoff's ceiling, so that a crowd refused together
// comes back spread out, more so the more often it was refused. It tells the app with a
// LimitedEvent. ok is false for any other err.
func (c *Client) limitedDelay(err error, attempt int) (delay time.Duration, ok bool) {
	var ce *CloseError
	if !errors.As(err, &ce) || !ce.Limited() {
		return 0, false
	}
	delay = ce.RetryAfter + rand.N(c.ceiling(attempt)+1)
	c.d.event(&LimitedEvent{Code: ce.Code, RetryAfter: ce.RetryAfter, Delay: delay})
	return delay, true
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// move answers the server's Reconnect: after its delay, log in elsewhere, then leave cur. A
// node that asks its clients to move is going away (a drain), so the login tries the other
// dispatched nodes before cur's, and one that fails is tried again after the reconnect backoff
// while cur lasts: a client left on a draining node would hold its drain up to its deadline. It
// returns the new connection, or nil when cur ended first or the login was refused for good
// (cur stays until it ends).
func (c *Client) move(cur *conn, r *clientpb.Reconnect) *conn {
	delay := time.Duration(r.GetDelayMs()) * time.Millisecond
	c.d.event(&ReconnectingEvent{Attempt: 1, Delay: delay, Err: fmt.Errorf("%w: %s", ErrMoved, r.GetReason())})
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-c.ctx.Done():
			return nil
		case <-cur.done:
			return nil
		case <-timer.C:
		}
		since, seq := c.d.recoverFrom()
		// The new connection is adopted as its LoginAck arrives: an app that sees its
		// ConnectedEvent or RecoveredEvent and sends finds it the Client's connection.
		next, err := c.establish(c.ctx, c.newLogin(since, seq, 0), true, cur.ep.Node, c.adopt)
		if err == nil {
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				cur.leave(c.ctx, c.cfg.AttemptTimeout)
			}()
			return next
		}
		if c.ctx.Err() != nil {
			return nil
		}
		c.d.event(&ErrorEvent{Err: err})
		if terminal(err) {
			return nil
		}
		delay, limited := c.limitedDelay(err, attempt)
		if !limited {
			delay = c.backoff(attempt)
		}
		c.d.event(&ReconnectingEvent{Attempt: attempt + 1, Delay: delay, Err: fmt.Errorf("%w: %w", ErrMoved, err)})
		timer.Reset(delay)
	}
}

// finish stops the Client with err: the ClosedEvent is the last thing the callbacks get.
func (c *Client) finish(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	c.cdn.stop()
	c.d.close(&ClosedEvent{Err: err})
	close(c.done)
}

// callbacks calls Config.OnMessage and Config.OnEvent, in order, until the Client has stopped.
func (c *Client) callbacks() {
	defer c.wg.Done()
	for {
		items, ok := c.d.take()
		var acks []string
		for _, it := range items {
			switch {
			case it.ack != "":
				acks = append(acks, it.ack)
			case it.msg != nil:
				if c.cfg.OnMessage != nil && !c.closed.Load() {
					c.cfg.OnMessage(it.msg)
					if it.msg.GetAtLeastOnce() {
						c.d.handedOn(it.msg.GetId())
						acks = append(acks, it.msg.GetId())
					}
				}
			case c.cfg.OnEvent != nil:
				if _, last := it.ev.(*ClosedEvent); last || !c.closed.Load() {
					c.cfg.OnEvent(it.ev)
				}
			}
		}
		if len(acks) > 0 {
			c.ack(acks)
		}
		if !ok {
			return
		}
	}
}

// LoginAck returns the server's answer to the latest login: session id, node, heartbeat
// interval and the session's app, room and uid. It must not be modified.
func (c *Client) LoginAck() *clientpb.LoginAck {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.ack
}

// Endpoint returns the endpoint of the latest connection.
func (c *Client) Endpoint() Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.ep
}

// LastID returns the greatest message id the Client has received: what a later Client (after a
// restart of the app, say) can pass as Config.RecoverSince. Empty before any.
func (c *Client) LastID() string {
	return c.d.lastSeen()
}

// Done is closed when the Client has stopped for good: after Close, a terminal close code, or
// (with Config.NoReconnect) the end of its connection.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the Client stopped, or nil while it runs (reconnecting included): ErrClosed
// after Close, a terminal *CloseError, or with Config.NoReconnect why the connection ended (a
// *CloseError, ErrServerTimeout, ErrSlowConsumer, an ErrProtocol error).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection, stops reconnecting and waits for the Client's goroutines,
// including a running callback. Messages still queued for OnMessage are dropped; the last
// event is a ClosedEvent with ErrClosed unless the Client had already stopped. It may be called
// more than once, but not from a callback. It always returns nil.
func (c *Client) Close() error {
	c.closed.Store(true)
	c.cancel()
	c.wg.Wait()
	return nil
}

// Send sends m to the room and waits for the server's answer: the SendAck, or a *SendError when
// the server refused it (the connection stays up). While the Client reconnects, Send waits for
// the next connection. The sender does not receive its own message. If ctx ends or the
// connection drops first, Send returns an error; the message may still be delivered.
func (c *Client) Send(ctx context.Context, m Outgoing) (*clientpb.SendAck, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("roomcast: send: %w", err)
	}
	// Refused before waiting for a connection; the largest seq makes the size an upper bound.
	f := &clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
		Seq: math.MaxUint64, Type: m.Type, Lane: m.Lane, Body: m.Body, TagExpr: m.TagExpr,
	}}}
	if n := proto.Size(f); n > MaxFrameSize {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, MaxFrameSize)
	}
	ack, err := onConn(c, ctx, "send", func(cur *conn) (*clientpb.SendAck, error) { return cur.send(ctx, m) })
	if err == nil {
		c.d.remember(ack.GetMessageId())
	}
	return ack, err
}

// onConn makes a request with do on the current connection (see connected). A request the
// connection refused unsent because a move had left it is made again on the next one.
func onConn[T any](c *Client, ctx context.Context, what string, do func(*conn) (T, error)) (T, error) {
	for {
		cur, err := c.connected(ctx, what)
		if err != nil {
			var zero T
			return zero, err
		}
		v, err := do(cur)
		if !errors.Is(err, errLeft) {
			return v, err
		}
	}
}

// connected returns the current connection, waiting for one while the Client reconnects. what
// names the caller in errors.
func (c *Client) connected(ctx context.Context, what string) (*conn, error) {
	for {
		c.mu.Lock()
		cur, ready, err := c.cur, c.ready, c.err
		c.mu.Unlock()
		switch {
		case err != nil:
			return nil, fmt.Errorf("roomcast: %s: %w", what, err)
		case cur != nil:
			return cur, nil
		}
		select {
		case <-ready:
		case <-c.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("roomcast: %s: %w", what, ctx.Err())
		}
	}
}
