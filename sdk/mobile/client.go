package mobile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// Client is a member's connection to its room that stays up: the Go SDK's sdk.Client, which
// reconnects, recovers what it missed, drops duplicates and orders messages. Its methods are
// safe to call from any thread.
type Client struct {
	cfg    Config
	c      *sdk.Client
	ctx    context.Context // ends with Close: bounds every Send
	cancel context.CancelFunc

	mu         sync.Mutex  // guards the field below
	background *time.Timer // pauses the Client after EnterBackground; nil in the foreground
}

// Outgoing is a message to Send.
type Outgoing struct {
	// Type is app-defined, e.g. "chat" or "gift"; at most 32 bytes.
	Type string
	// Lane is LaneCritical, LaneNormal or LaneBulk. Zero value means LaneNormal.
	Lane string
	// Body must not be empty and may be at most 16,384 bytes.
	Body []byte
	// TagExpr, if not empty, limits delivery to members whose tags satisfy it.
	TagExpr string
}

// SendResult is the server's answer to a Send: the message's id and time, or a refusal with
// its code. A refusal is a result rather than an error so that an app can read its code from
// Java or Swift; the connection stays up.
type SendResult struct {
	// MessageID is the id the server gave the message; empty when it was refused.
	MessageID string
	// ServerTimeMs is when the server accepted it, Unix milliseconds.
	ServerTimeMs int64
	// ErrorCode is 0 when the message was accepted, else why it was refused: an Error.code of
	// docs/protocol.md §4 (e.g. 102, rate limited).
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
	// Temporary reports whether a refused Send may succeed later (5xx codes and rate limited).
	Temporary bool
	// RetryAfterMs is the server's hint with ErrorCode 120 (SEND_RATE_LIMITED): the same Send
	// is accepted after this many milliseconds.
	RetryAfterMs int64
}

// NewClient finds a ChatLink through the dispatcher, connects and logs in, and returns the
// Client once the login succeeded; from then on it reconnects by itself until Close or a
// terminal close code. It blocks (at most Config.ConnectTimeoutMs), so an app calls it off
// its UI thread. It returns an error if no ChatLink took the login; it does not retry, but for
// a login refused for now (4013, 4015): then it waits the server's hint plus jitter (a
// "limited" event) and tries again within Config.ConnectTimeoutMs.
//
// listener receives the Client's messages and events, starting with a "connected" event; nil
// means they are discarded.
func NewClient(config *Config, listener Listener) (*Client, error) {
	if config == nil {
		return nil, errors.New("roomcast: NewClient needs a Config")
	}
	cfg := config.withDefaults()
	if cfg.Dispatcher == "" {
		return nil, errors.New("roomcast: Config needs Dispatcher")
	}
	sc, err := cfg.sdkConfig()
	if err != nil {
		return nil, err
	}
	if listener != nil {
		sc.OnMessage = func(m *clientpb.Message) { listener.OnMessage(newMessage(m)) }
		sc.OnEvent = func(ev sdk.Event) {
			if e := newEvent(ev); e != nil {
				listener.OnEvent(e)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), millis(cfg.ConnectTimeoutMs))
	defer cancel()
	c, err := sdk.Dial(ctx, sc)
	if err != nil {
		return nil, err
	}
	cl := &Client{cfg: cfg, c: c}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	return cl, nil
}

// Send sends m to the room and waits for the server's answer, at most Config.SendTimeoutMs;
// while the Client reconnects it waits for the next connection. It returns an error when no
// answer came (the Client closed, the time ran out, the connection dropped: the message may
// still have been delivered) or m cannot be sent (an unknown lane, a frame too large). The
// sender does not receive its own message.
func (c *Client) Send(m *Outgoing) (*SendResult, error) {
	if m == nil {
		return nil, errors.New("roomcast: send: no message")
	}
	lane, err := parseLane(m.Lane)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	ack, err := c.c.Send(ctx, sdk.Outgoing{Type: m.Type, Lane: lane, Body: m.Body, TagExpr: m.TagExpr})
	if se := (*sdk.SendError)(nil); errors.As(err, &se) {
		return &SendResult{ErrorCode: int32(se.Code), ErrorMessage: se.Message, Temporary: se.Temporary(), RetryAfterMs: se.RetryAfter.Milliseconds()}, nil
	}
	if err != nil {
		return nil, err
	}
	return &SendResult{MessageID: ack.GetMessageId(), ServerTimeMs: ack.GetServerTimeMs()}, nil
}

func parseLane(lane string) (clientpb.Lane, error) {
	switch lane {
	case LaneCritical:
		return clientpb.Lane_LANE_CRITICAL, nil
	case LaneNormal, "":
		return clientpb.Lane_LANE_NORMAL, nil
	case LaneBulk:
		return clientpb.Lane_LANE_BULK, nil
	}
	return 0, fmt.Errorf("roomcast: send: unknown lane %q (want %q, %q or %q)", lane, LaneCritical, LaneNormal, LaneBulk)
}

// LastID returns the greatest message id the Client has received: what the app saves to pass
// as Config.RecoverSince after a restart. Empty before any.
func (c *Client) LastID() string { return c.c.LastID() }

// Closed reports whether the Client has stopped for good: after Close, a terminal close code,
// or (with Config.NoReconnect) the end of its connection. The "closed" event says why.
func (c *Client) Closed() bool { return c.c.Err() != nil }

// Close ends the connection, stops reconnecting, ends waiting Sends and waits for the Client's
// goroutines, a running Listener call included; the last event is "closed". It may be called
// more than once, but not from a Listener method (it would wait for itself).
func (c *Client) Close() {
	c.mu.Lock()
	if c.background != nil {
		c.background.Stop()
	}
	c.mu.Unlock()
	c.cancel()
	c.c.Close()
}
