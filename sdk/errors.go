package sdk

import (
	"errors"
	"fmt"
	"time"

	"roomcast/proto/clientpb"
)

// CodeAbnormalClosure is the CloseError code for a connection that ended without a Roomcast or
// WebSocket close code: a reset, an EOF, a TCP close without a Kick. It is WebSocket's 1006 and
// counts as transient, like every code outside 4000–4499.
const CodeAbnormalClosure = 1006

var (
	// ErrClosed is the error of a Client that was closed by its user.
	ErrClosed = errors.New("roomcast: client closed")

	// ErrServerTimeout means nothing arrived from the server for three heartbeat intervals;
	// the Client gave up on the connection.
	ErrServerTimeout = errors.New("roomcast: no frame from the server for three heartbeat intervals")

	// ErrSlowConsumer means pushed messages arrived faster than Config.OnMessage handled them
	// and the buffer (Config.MessageBuffer) filled up; the Client closed rather than drop
	// messages silently.
	ErrSlowConsumer = errors.New("roomcast: message buffer full: OnMessage is too slow")

	// ErrProtocol wraps every violation of the wire protocol by the server: an unparsable
	// frame, a client-only frame, a frame out of order.
	ErrProtocol = errors.New("roomcast: protocol error")

	// ErrFrameTooLarge is returned by Send for a message whose frame would exceed the
	// protocol's 65,536 bytes; nothing is sent.
	ErrFrameTooLarge = errors.New("roomcast: frame too large")

	// ErrBadToken is returned by Dial for a token whose claims cannot be read. The token is
	// not verified by the client; the server does that.
	ErrBadToken = errors.New("roomcast: malformed token")

	// ErrVersion wraps ErrProtocol: the server answered the login with a protocol version
	// this SDK does not speak.
	ErrVersion = fmt.Errorf("%w: unsupported protocol version", ErrProtocol)

	// ErrMoved is why a connection was left when the server asked the client to move to
	// another ChatLink (a Reconnect frame, sent by a draining node).
	ErrMoved = errors.New("roomcast: the server asked to move to another ChatLink")

	// ErrHistoryUnavailable means the history a login asked for did not come: the server
	// could not read it, or did not answer within Config.RecoveryWait.
	ErrHistoryUnavailable = errors.New("roomcast: the room's history is unavailable")

	// ErrNoEndpoints means the dispatcher (or Config.Endpoints) offered nothing to dial with the
	// configured transport.
	ErrNoEndpoints = errors.New("roomcast: no endpoints")
)

// CloseError is why the server ended a connection: the code of its Kick frame or WebSocket close
// frame (see docs/protocol.md §5), or CodeAbnormalClosure when the connection just dropped.
type CloseError struct {
	// Code is a clientpb.CloseCode (4000–4999), a WebSocket close code (1000–1015) or
	// CodeAbnormalClosure.
	Code uint32
	// Reason is the server's free-text explanation, if it gave one.
	Reason string
	// Err is the transport error behind an abnormal closure, if any.
	Err error
	// RetryAfter is the server's hint with 4013 (LOGIN_RATE_LIMITED) and 4015
	// (TOO_MANY_CONNECTIONS): the Kick's retry_after_ms, or the Retry-After of a refused
	// WebSocket upgrade. The Client waits this long plus jitter before it logs in again.
	RetryAfter time.Duration
}

// Error implements error.
func (e *CloseError) Error() string {
	msg := fmt.Sprintf("roomcast: connection closed: code %d", e.Code)
	if e.Code >= 4000 && e.Code < 5000 {
		msg += " (" + clientpb.CloseCode(e.Code).String() + ")"
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the transport error behind the close, if any.
func (e *CloseError) Unwrap() error { return e.Err }

// Terminal reports whether reconnecting without changing something (a new token, a fixed
// client) will fail again: codes 4000–4499 but 4013 (LOGIN_RATE_LIMITED) and 4015
// (TOO_MANY_CONNECTIONS), which say when to come back. Every other code is transient.
func (e *CloseError) Terminal() bool {
	return e.Code >= 4000 && e.Code < 4500 && !e.Limited()
}

// Limited reports whether the server refused the login for now because of a rate or a
// connection count (4013, 4015): the same login succeeds after RetryAfter.
func (e *CloseError) Limited() bool {
	return e.Code == uint32(clientpb.CloseCode_CLOSE_CODE_LOGIN_RATE_LIMITED) ||
		e.Code == uint32(clientpb.CloseCode_CLOSE_CODE_TOO_MANY_CONNECTIONS)
}

// SendError is a Send the server refused with an Error frame (docs/protocol.md §4). The
// connection stays open.
type SendError struct {
	// Code is a clientpb.ErrorCode.
	Code uint32
	// Message is the server's explanation.
	Message string
	// RetryAfter is the server's hint with SEND_RATE_LIMITED (120): the same Send is accepted
	// after this long. Zero with other codes.
	RetryAfter time.Duration
}

// Error implements error.
func (e *SendError) Error() string {
	return fmt.Sprintf("roomcast: send refused: code %d (%s): %s",
		e.Code, clientpb.ErrorCode(e.Code).String(), e.Message)
}

// Temporary reports whether the same Send may succeed later (5xx codes, RATE_LIMITED and
// SEND_RATE_LIMITED, the latter after RetryAfter); other 1xx codes fail again unchanged.
func (e *SendError) Temporary() bool {
	return e.Code >= 500 || e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_RATE_LIMITED) ||
		e.Code == uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED)
}

// Is lets errors.Is match a SendError by code: errors.Is(err, sdk.ErrLaneNotAllowed).
func (e *SendError) Is(target error) bool {
	t, ok := target.(*SendError)
	return ok && t.Code == e.Code
}

// Send errors to match with errors.Is.
var (
	// ErrLaneNotAllowed: the Send named the critical lane, which the room (its critical_expr)
	// and the member's token (its lanes claim) do not allow this member; send it on another
	// lane. By default only the app server sends critical messages.
	ErrLaneNotAllowed = &SendError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED)}
	// ErrSendRateLimited: the Send was over a send rate (of the connection, the user, or the
	// room's members together); send it again after its RetryAfter.
	ErrSendRateLimited = &SendError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED)}
)

// sendError is the SendError of an Error frame.
func sendError(e *clientpb.Error) *SendError {
	return &SendError{Code: e.GetCode(), Message: e.GetMessage(), RetryAfter: time.Duration(e.GetRetryAfterMs()) * time.Millisecond}
}
