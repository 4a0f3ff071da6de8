package sdk

import (
	"time"

	"roomcast/proto/clientpb"
)

// Event is something that happened to a Client, handed to Config.OnEvent in order with the
// messages: *ConnectedEvent, *ReconnectingEvent, *RecoveredEvent, *ThinnedEvent, *KickedEvent,
// *LimitedEvent, *ErrorEvent, *CounterEvent, *CounterRefusedEvent, *RecalledEvent or
// *ClosedEvent. Switch on its type.
type Event interface{ event() }

// ConnectedEvent: a login succeeded, the first (from Dial) or after a reconnect.
type ConnectedEvent struct {
	LoginAck *clientpb.LoginAck
	Endpoint Endpoint
	// Reconnected is false for the connection Dial made and true for every later one.
	Reconnected bool
}

// ReconnectingEvent: the connection ended (Err says why: a *CloseError, ErrServerTimeout,
// ErrSlowConsumer, an ErrProtocol error, or a failed attempt's error), or the server asked the
// client to move (Err wraps ErrMoved); the client connects again after Delay.
type ReconnectingEvent struct {
	// Attempt counts the attempts since the last connection that stayed up (Config.StableAfter),
	// from 1. The delay grows with it.
	Attempt int
	Delay   time.Duration
	Err     error
}

// RecoveredEvent: the answer to a login that asked for what was missed (after a reconnect, or
// Config.RecoverSince or Config.History on the first login) has been delivered. Every message
// it brought was handed to OnMessage before this event.
type RecoveredEvent struct {
	// Since is the message id the login recovered from; empty for Config.History.
	Since string
	// Recovered is true when nothing is missing: every kept message after Since that this member
	// may see has been delivered (also when there was none). False when the gap was larger than
	// the room's history (the server's count or age limit): Missing says how many are lost.
	Recovered bool
	// Missing, when Recovered is false, is how many of the room's critical and normal messages
	// after Since are no longer kept; 0 when the server could not count them (the client had
	// seen no numbered message). It may include messages this member's tags would not allow.
	Missing uint64
	// Count is how many messages the answer brought that had not arrived otherwise.
	Count int
	// Err is set when the server could not answer (ErrHistoryUnavailable, or a *SendError for
	// a refused recover_since): nothing was recovered, and Recovered is false.
	Err error
}

// ThinnedEvent: the room's budget, the node's flow control or this client's slow reading left
// messages out of the stream, counted per lane since the previous Push. Critical messages are
// never left out.
type ThinnedEvent struct {
	Normal, Bulk uint32
}

// KickedEvent: the server sent a Kick and closed the connection. Terminal codes (4000–4499)
// end the Client (a ClosedEvent follows); the client reconnects after the others.
type KickedEvent struct {
	Code   uint32
	Reason string
	// Terminal reports whether the client gives up rather than reconnects.
	Terminal bool
}

// LimitedEvent: the server refused a login for now (Code 4013 LOGIN_RATE_LIMITED: a login or
// join rate; 4015 TOO_MANY_CONNECTIONS: the address's connections on the node) and said when
// to come back. The client waits Delay (RetryAfter plus jitter) and logs in again, through the
// dispatcher when it uses one: from Dial, or as a reconnect (a ReconnectingEvent with the same
// Delay follows).
type LimitedEvent struct {
	Code uint32
	// RetryAfter is the server's hint; 0 when it gave none (the client's backoff then).
	RetryAfter time.Duration
	Delay      time.Duration
}

// ErrorEvent: something went wrong that the client handles by itself: a reconnect attempt that
// failed, a server that broke the protocol, a history the server could not send. Err says
// what.
type ErrorEvent struct {
	Err error
}

// ClosedEvent: the Client stopped for good; it is the last event. Err is the same as
// Client.Err: ErrClosed after Close, a terminal *CloseError, or (with Config.NoReconnect) why
// the connection ended.
type ClosedEvent struct {
	Err error
}

func (*ConnectedEvent) event()    {}
func (*ReconnectingEvent) event() {}
func (*RecoveredEvent) event()    {}
func (*ThinnedEvent) event()      {}
func (*KickedEvent) event()       {}
func (*LimitedEvent) event()      {}
func (*ErrorEvent) event()        {}
func (*ClosedEvent) event()       {}
