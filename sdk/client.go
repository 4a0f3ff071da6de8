package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/roomcastpb"
)

// Client is one logged-in connection to a ChatLink. Its methods are safe for concurrent use.
//
// A Client runs three goroutines, all of which Close waits for: a reader that answers Sends
// and queues pushed messages, a heartbeat sender that also notices a silent server, and an event
// goroutine that calls Config.OnMessage, OnReconnect and OnClose in order.
type Client struct {
	cfg  Config
	log  *slog.Logger
	conn frameConn
	ep   Endpoint
	ack  *roomcastpb.LoginAck // set before Dial returns it, then read-only

	loginAck chan *roomcastpb.LoginAck // reader -> Dial, at most one value
	events   chan event                // reader -> event goroutine; closed when the reader ends

	loggedIn   atomic.Bool
	userClosed atomic.Bool
	nextSeq    atomic.Uint64
	lastFrame  atomic.Int64 // when the last frame arrived, unix nanoseconds
	interval   atomic.Int64 // heartbeat interval, nanoseconds

	done chan struct{} // closed when the connection has ended; err is set by then
	wg   sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	err     error
	pending map[uint64]chan sendResult // Sends waiting for their SendAck or Error, by seq
}

// event is one thing for the event goroutine to hand to a callback.
type event struct {
	msg       *roomcastpb.Message
	reconnect *roomcastpb.Reconnect
}

type sendResult struct {
	ack *roomcastpb.SendAck
	err error
}

// Outgoing is a message to Send.
type Outgoing struct {
	// Type is app-defined, e.g. "chat" or "gift"; at most 32 bytes.
	Type string
	// Lane is the message's priority class. LANE_UNSPECIFIED means LANE_NORMAL.
	Lane roomcastpb.Lane
	// Body must not be empty and may be at most 16,384 bytes.
	Body []byte
	// TagExpr, if not empty, limits delivery to members whose tags satisfy it.
	TagExpr string
}

// Dial finds a ChatLink, connects and logs in, and returns the Client once the LoginAck
// arrived. It tries the endpoints from Config.Endpoints, or else from the dispatcher, in order:
// a failed connection, a timeout (Config.AttemptTimeout) or a transient close code moves on to
// the next endpoint; a terminal close code (4000–4499, a *CloseError) is returned at once,
// because another ChatLink would refuse the same token too.
//
// ctx bounds only the dialing and login; the Client lives until Close or until the connection
// ends.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	endpoints := cfg.Endpoints
	if len(endpoints) == 0 {
		if endpoints, err = dispatchToken(ctx, cfg.HTTPClient, cfg.closeDispatch, cfg.Dispatcher, cfg.Token); err != nil {
			return nil, err
		}
	}

	var errs []error
	for _, ep := range endpoints {
		c, err := connect(ctx, cfg, ep)
		if err == nil {
			return c, nil
		}
		err = fmt.Errorf("roomcast: %s %s: %w", ep.Node, endpointAddr(ep, cfg.Transport), err)
		if ctx.Err() != nil {
			return nil, err
		}
		if terminal(err) {
			return nil, err
		}
		cfg.Logger.Debug("roomcast: endpoint failed, trying the next", "node", ep.Node, "err", err)
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// connect dials ep and logs in. On success the Client's goroutines are running.
func connect(ctx context.Context, cfg Config, ep Endpoint) (*Client, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
	defer cancel()
	conn, err := dialTransport(ctx, &cfg, ep)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect: %w", ctx.Err())
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	c := &Client{
		cfg:      cfg,
		log:      cfg.Logger,
		conn:     conn,
		ep:       ep,
		loginAck: make(chan *roomcastpb.LoginAck, 1),
		events:   make(chan event, cfg.MessageBuffer),
		done:     make(chan struct{}),
		pending:  make(map[uint64]chan sendResult),
	}
	c.lastFrame.Store(time.Now().UnixNano())
	c.wg.Add(1)
	go c.readLoop()

	login := &roomcastpb.Frame{Kind: &roomcastpb.Frame_Login{Login: &roomcastpb.Login{
		Token: cfg.Token, Device: cfg.Device, Client: ClientName,
		RecoverSince: cfg.RecoverSince, History: uint32(max(0, cfg.History)),
	}}}
	if err := c.writeFrame(login); err != nil {
		c.shutdown(err)
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
			// succeeded, and the caller learns of the close like of any later one.
			c.start(ack)
			return c, nil
		default:
		}
		c.wg.Wait()
		return nil, fmt.Errorf("login: %w", c.Err())
	case <-ctx.Done():
		c.shutdown(ctx.Err())
		return nil, fmt.Errorf("login: %w", ctx.Err())
	}
}

// start runs the goroutines of a logged-in Client.
func (c *Client) start(ack *roomcastpb.LoginAck) {
	c.ack = ack
	c.setInterval(ack.GetHeartbeatIntervalMs())
	c.wg.Add(2)
	go c.heartbeatLoop()
	go c.eventLoop()
}

// LoginAck returns the server's answer to the login: session id, node, heartbeat interval and
// the session's app, room and uid. It must not be modified.
func (c *Client) LoginAck() *roomcastpb.LoginAck { return c.ack }

// Endpoint returns the endpoint the Client is connected to.
func (c *Client) Endpoint() Endpoint { return c.ep }

// Done is closed when the connection has ended, by Close or otherwise.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up: ErrClosed after Close, a
// *CloseError when the server closed it (Kick, close frame) or it dropped, ErrServerTimeout,
// ErrSlowConsumer, or an error wrapping ErrProtocol.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection and waits for the Client's goroutines, including a running
// callback. Messages still queued for OnMessage are dropped; OnClose is called with ErrClosed
// unless the connection had already ended. It may be called more than once, but not from a
// callback. It always returns nil.
func (c *Client) Close() error {
	c.shutdown(ErrClosed)
	return nil
}

func (c *Client) shutdown(err error) {
	c.userClosed.Store(true)
	c.fail(err)
	c.wg.Wait()
}

// fail ends the connection with err, unless it has already ended. Pending Sends return err.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	c.conn.close()
}

// Send sends m to the room and waits for the server's answer: the SendAck, or a *SendError when
// the server refused it (the connection stays up). The sender does not receive its own message.
// If ctx ends first, Send returns ctx's error; the message may still be delivered.
func (c *Client) Send(ctx context.Context, m Outgoing) (*roomcastpb.SendAck, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("roomcast: send: %w", err)
	}
	seq := c.nextSeq.Add(1)
	answer := make(chan sendResult, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, fmt.Errorf("roomcast: send: %w", err)
	}
	c.pending[seq] = answer
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, seq)
		c.mu.Unlock()
	}()

	f := &roomcastpb.Frame{Kind: &roomcastpb.Frame_Send{Send: &roomcastpb.Send{
		Seq: seq, Type: m.Type, Lane: m.Lane, Body: m.Body, TagExpr: m.TagExpr,
	}}}
	if err := c.writeFrame(f); err != nil {
		return nil, fmt.Errorf("roomcast: send: %w", err)
	}
	select {
	case r := <-answer:
		return r.ack, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("roomcast: send: %w", ctx.Err())
	case <-c.done:
		select {
		case r := <-answer: // answered just before the end
			return r.ack, r.err
		default:
			return nil, fmt.Errorf("roomcast: send: %w", c.Err())
		}
	}
}

// writeFrame sends f. A frame over MaxFrameSize is refused without harm to the connection; a
// failed write ends the connection.
func (c *Client) writeFrame(f *roomcastpb.Frame) error {
	if n := proto.Size(f); n > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, MaxFrameSize)
	}
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if err := c.conn.write(f); err != nil {
		c.fail(fmt.Errorf("roomcast: write: %w", err))
		return c.Err()
	}
	return nil
}

// readLoop runs the transport's reader until the connection ends.
func (c *Client) readLoop() {
	defer c.wg.Done()
	defer close(c.events)
	err := c.conn.serve(c.handleFrame)
	c.fail(err)
}

// handleFrame acts on one frame from the server. It runs on the reader goroutine and never
// blocks: pushed messages go to a bounded queue.
func (c *Client) handleFrame(f *roomcastpb.Frame) {
	select {
	case <-c.done:
		return // frames still buffered after the end
	default:
	}
	c.lastFrame.Store(time.Now().UnixNano())

	loggedIn := c.loggedIn.Load()
	switch k := f.Kind.(type) {
	case *roomcastpb.Frame_LoginAck:
		if !c.loggedIn.CompareAndSwap(false, true) {
			c.fail(fmt.Errorf("%w: a second LoginAck", ErrProtocol))
			return
		}
		c.loginAck <- k.LoginAck
		return
	case *roomcastpb.Frame_Kick:
		c.fail(&CloseError{Code: k.Kick.GetCode(), Reason: k.Kick.GetReason()})
		return
	case *roomcastpb.Frame_Reconnect:
		c.log.Info("roomcast: server asks to reconnect",
			"node", c.ep.Node, "delay_ms", k.Reconnect.GetDelayMs(), "reason", k.Reconnect.GetReason())
		c.enqueue(event{reconnect: k.Reconnect})
		return
	case nil:
		return // a frame kind newer than this SDK
	}
	if !loggedIn {
		c.fail(fmt.Errorf("%w: %T before LoginAck", ErrProtocol, f.Kind))
		return
	}
	switch k := f.Kind.(type) {
	case *roomcastpb.Frame_SendAck:
		c.answer(k.SendAck.GetSeq(), sendResult{ack: k.SendAck})
	case *roomcastpb.Frame_Error:
		e := k.Error
		if e.GetSeq() == 0 {
			c.log.Warn("roomcast: error from server", "code", e.GetCode(), "message", e.GetMessage())
			return
		}
		c.answer(e.GetSeq(), sendResult{err: &SendError{Code: e.GetCode(), Message: e.GetMessage()}})
	case *roomcastpb.Frame_Push:
		for _, m := range k.Push.GetMessages() {
			if !c.enqueue(event{msg: m}) {
				return
			}
		}
	case *roomcastpb.Frame_HeartbeatAck:
		c.setInterval(k.HeartbeatAck.GetHeartbeatIntervalMs())
	case *roomcastpb.Frame_CdnConfig:
		// The room's CDN lanes moved to segments (or back): this SDK does not poll them yet.
		c.log.Debug("roomcast: CDN config changed", "mode", k.CdnConfig.GetMode())
	default:
		c.fail(fmt.Errorf("%w: the server sent a client frame %T", ErrProtocol, f.Kind))
	}
}

// answer hands r to the Send waiting for seq, if it still waits.
func (c *Client) answer(seq uint64, r sendResult) {
	c.mu.Lock()
	ch := c.pending[seq]
	delete(c.pending, seq)
	c.mu.Unlock()
	if ch != nil {
		ch <- r // buffered, and answered at most once
	}
}

// enqueue queues ev for the event goroutine, or ends the connection with ErrSlowConsumer when
// the queue is full: stalling the reader would hold up acks and heartbeats and only move the
// backlog into the server.
func (c *Client) enqueue(ev event) bool {
	select {
	case c.events <- ev:
		return true
	default:
		c.fail(ErrSlowConsumer)
		return false
	}
}

// eventLoop calls the callbacks, in order, until the reader ends, then calls OnClose.
func (c *Client) eventLoop() {
	defer c.wg.Done()
	for ev := range c.events {
		if c.userClosed.Load() {
			continue // Close drops what is still queued
		}
		switch {
		case ev.msg != nil && c.cfg.OnMessage != nil:
			c.cfg.OnMessage(ev.msg)
		case ev.reconnect != nil && c.cfg.OnReconnect != nil:
			c.cfg.OnReconnect(ev.reconnect)
		}
	}
	if c.cfg.OnClose != nil {
		c.cfg.OnClose(c.Err())
	}
}

func (c *Client) setInterval(ms uint32) {
	if ms == 0 {
		if c.interval.Load() != 0 {
			return // keep the interval we have
		}
		c.interval.Store(int64(defaultHeartbeatInterval))
		return
	}
	c.interval.Store(int64(max(time.Duration(ms)*time.Millisecond, minHeartbeatInterval)))
}

// heartbeatLoop sends a Heartbeat every interval and ends the connection with ErrServerTimeout
// when nothing has arrived for three intervals (the server answers every Heartbeat, so a live
// server is never silent that long).
func (c *Client) heartbeatLoop() {
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
			hb := &roomcastpb.Frame{Kind: &roomcastpb.Frame_Heartbeat{Heartbeat: &roomcastpb.Heartbeat{
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
