package mobile

import (
	"errors"
	"math"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// Lanes, for Message.Lane and Outgoing.Lane: a message's priority class (docs/protocol.md).
const (
	LaneCritical = "critical"
	LaneNormal   = "normal"
	LaneBulk     = "bulk"
)

// Event kinds, for Event.Kind.
const (
	// EventConnected: a login succeeded, the first (from NewClient) or after a reconnect
	// (Reconnected). Node, SessionID.
	EventConnected = "connected"
	// EventReconnecting: the connection ended, or the server asked the client to move; the
	// Client connects again after DelayMs. Attempt, DelayMs, Error.
	EventReconnecting = "reconnecting"
	// EventPaused: the Client left its connection in the background (EnterBackground, after
	// Config.BackgroundLingerMs) and connects again after EnterForeground.
	EventPaused = "paused"
	// EventRecovered: the history a login asked for (after a reconnect, or
	// Config.RecoverSince or Config.History) has been handed to OnMessage. Since, Recovered,
	// Missing, Count, Error.
	EventRecovered = "recovered"
	// EventThinned: the room's budget, the node's flow control or this client's slow reading
	// left messages out. ThinnedNormal, ThinnedBulk.
	EventThinned = "thinned"
	// EventKicked: the server sent a Kick and closed the connection. Code, Reason, Terminal.
	EventKicked = "kicked"
	// EventLimited: the server refused a login for now (Code 4013 LOGIN_RATE_LIMITED or 4015
	// TOO_MANY_CONNECTIONS) and said when to come back (RetryAfterMs); the Client logs in
	// again after DelayMs (the hint plus jitter). Code, RetryAfterMs, DelayMs.
	EventLimited = "limited"
	// EventError: something the Client handles by itself went wrong (a failed reconnect
	// attempt, a protocol error, a history the server could not send). Error.
	EventError = "error"
	// EventClosed: the Client stopped for good; the last event. Error ("roomcast: client
	// closed" after Close), Code for a terminal close code.
	EventClosed = "closed"
	// EventCounters: the room's counters changed, or the login found some. Counters (every
	// counter of the room, a reset one absent).
	EventCounters = "counters"
	// EventCounterRefused: the server refused an AddCounter; the amount was not counted.
	// CounterName, Code (120 over the rate: RetryAfterMs; 124 too many counters; 100 an amount
	// over the limit), Error.
	EventCounterRefused = "counter_refused"
	// EventRecalled: a message of the room was recalled (MessageID, RecalledMs, ByUID): remove
	// it from what the app shows. The Client does not pass it to OnMessage from then on.
	EventRecalled = "recalled"
)

// Listener is what the app implements to receive a Client's messages and events. Both methods
// are called on one thread owned by the Client, in order; they must hand work to the app's
// own threads (the UI's, say) rather than block, and must not call Client.Close.
type Listener interface {
	// OnMessage receives every message of the room once, ordered by (server time, id).
	OnMessage(m *Message)
	// OnEvent receives the Client's events, in order with the messages.
	OnEvent(e *Event)
}

// Message is a message of the room (roomcast.v1.Message).
type Message struct {
	// ID is time-ordered and unique across the deployment (26 characters).
	ID   string
	Room string
	// Sender is the sender's uid; empty for messages the app server sent without one.
	Sender  string
	Type    string
	Lane    string
	TagExpr string
	Body    []byte
	// ServerTimeMs is when the server accepted the message, Unix milliseconds.
	ServerTimeMs int64
	// RoomSeq is the message's number in its room's history; 0 for bulk messages.
	RoomSeq int64
	// AtLeastOnce marks a message the app server sent at least once: the client acknowledges
	// it once the message callback returned, and drops copies (docs/go-sdk.md).
	AtLeastOnce bool
}

// Event is something that happened to a Client. Kind says what (one of the Event constants);
// the fields each kind sets are listed with it, the others are zero.
type Event struct {
	Kind string

	// Node and SessionID name the ChatLink and the session of a connection.
	Node, SessionID string
	// Reconnected is false for the connection NewClient made and true for every later one.
	Reconnected bool

	// Attempt counts the reconnect attempts since the last connection that stayed up, from 1.
	Attempt int
	// DelayMs is the wait before the next attempt, in milliseconds.
	DelayMs int64
	// RetryAfterMs is the server's retry hint of a limited login, in milliseconds.
	RetryAfterMs int64

	// Since is the message id a login recovered from; empty for Config.History.
	Since string
	// Recovered is true when nothing is missing; false when the gap was larger than the
	// room's history (Missing says how many are lost) or Error is set.
	Recovered bool
	// Missing is how many of the room's messages are no longer kept (0 if the server could
	// not count them).
	Missing int64
	// Count is how many messages the recovery brought that had not arrived otherwise.
	Count int

	// ThinnedNormal and ThinnedBulk are how many messages of each lane were left out since the
	// previous push. Critical messages are never left out.
	ThinnedNormal, ThinnedBulk int64

	// Code is a close code (docs/protocol.md §5): the Kick's, or the one that closed the Client.
	Code int32
	// Reason is the server's explanation of a Kick.
	Reason string
	// Terminal reports whether a Kick ends the Client (codes 4000–4499) rather than a
	// reconnect following.
	Terminal bool

	// Counters are the room's counters of an EventCounters.
	Counters *Counters
	// CounterName names the counter of an EventCounterRefused.
	CounterName string

	// MessageID is the recalled message of an EventRecalled; RecalledMs is when it was
	// recalled (server time, Unix milliseconds); ByUID the member who recalled it (its sender or
	// a moderator of the room), empty when the app server did.
	MessageID  string
	RecalledMs int64
	ByUID      string

	// Error says what went wrong, or why the Client stopped; empty if nothing did.
	Error string
}

// newMessage converts a message of the Go SDK.
func newMessage(m *clientpb.Message) *Message {
	return &Message{
		ID: m.GetId(), Room: m.GetRoom(), Sender: m.GetSender(), Type: m.GetType(),
		Lane: laneName(m.GetLane()), TagExpr: m.GetTagExpr(), Body: m.GetBody(),
		ServerTimeMs: m.GetServerTimeMs(), RoomSeq: toInt64(m.GetRoomSeq()), AtLeastOnce: m.GetAtLeastOnce(),
	}
}

// newEvent converts an event of the Go SDK.
func newEvent(ev sdk.Event) *Event {
	switch e := ev.(type) {
	case *sdk.ConnectedEvent:
		return &Event{Kind: EventConnected, Node: e.LoginAck.GetNode(), SessionID: e.LoginAck.GetSessionId(), Reconnected: e.Reconnected}
	case *sdk.ReconnectingEvent:
		if errors.Is(e.Err, sdk.ErrPaused) && e.Attempt == 0 {
			return &Event{Kind: EventPaused}
		}
		return &Event{Kind: EventReconnecting, Attempt: e.Attempt, DelayMs: e.Delay.Milliseconds(), Error: errorText(e.Err)}
	case *sdk.RecoveredEvent:
		return &Event{Kind: EventRecovered, Since: e.Since, Recovered: e.Recovered, Missing: toInt64(e.Missing), Count: e.Count, Error: errorText(e.Err)}
	case *sdk.ThinnedEvent:
		return &Event{Kind: EventThinned, ThinnedNormal: int64(e.Normal), ThinnedBulk: int64(e.Bulk)}
	case *sdk.KickedEvent:
		return &Event{Kind: EventKicked, Code: int32(e.Code), Reason: e.Reason, Terminal: e.Terminal}
	case *sdk.LimitedEvent:
		return &Event{Kind: EventLimited, Code: int32(e.Code), RetryAfterMs: e.RetryAfter.Milliseconds(), DelayMs: e.Delay.Milliseconds()}
	case *sdk.ErrorEvent:
		return &Event{Kind: EventError, Error: errorText(e.Err)}
	case *sdk.CounterEvent:
		return &Event{Kind: EventCounters, Counters: newCounters(e.Totals, e.Version)}
	case *sdk.CounterRefusedEvent:
		return &Event{Kind: EventCounterRefused, CounterName: e.Name, Code: int32(e.Err.Code),
			RetryAfterMs: e.Err.RetryAfter.Milliseconds(), Error: e.Err.Message}
	case *sdk.RecalledEvent:
		return &Event{Kind: EventRecalled, MessageID: e.ID, RecalledMs: e.At.UnixMilli(), ByUID: e.ByUID}
	case *sdk.ClosedEvent:
		out := &Event{Kind: EventClosed, Error: errorText(e.Err)}
		if ce := (*sdk.CloseError)(nil); errors.As(e.Err, &ce) {
			out.Code = int32(ce.Code)
		}
		return out
	}
	return nil // an event this facade does not know yet: not passed on
}

func laneName(l clientpb.Lane) string {
	switch l {
	case clientpb.Lane_LANE_CRITICAL:
		return LaneCritical
	case clientpb.Lane_LANE_BULK:
		return LaneBulk
	}
	return LaneNormal // LANE_UNSPECIFIED means normal
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// toInt64 converts the protocol's unsigned counters for Java and Objective-C, which have no
// unsigned 64-bit integer gobind binds.
func toInt64(n uint64) int64 { return int64(min(n, math.MaxInt64)) }
