package sdk

import (
	"context"
	"fmt"
	"time"

	"roomcast/proto/clientpb"
)

// Moderators in the room (docs/protocol.md, "Moderators"): a member whose tags satisfy the
// room's moderator_expr mutes, unmutes and removes the members of its scope (those sharing one
// of its tags that start with the room's moderator_scope_prefix), and recalls their messages;
// one whose tags satisfy moderator_room_expr, every member. The server refuses anyone else, and
// any member outside the scope, with a ModerateError; it writes an audit record of every request.

// ModerateError is the server's refusal of a moderate request: the connection stays up.
type ModerateError struct {
	// Code is a clientpb.ErrorCode: 140 NOT_MODERATOR, 141 OUTSIDE_SCOPE, 107 USER_NOT_FOUND,
	// 100 BAD_REQUEST, 105 ROOM_NOT_FOUND, 120 SEND_RATE_LIMITED (over the connection's
	// moderate rate), 503 UNAVAILABLE; for RecallAsModerator also 130 MESSAGE_NOT_FOUND.
	Code uint32
	// Message is the server's explanation.
	Message string
}

// Error implements error.
func (e *ModerateError) Error() string {
	return fmt.Sprintf("roomcast: moderate request refused: code %d (%s): %s",
		e.Code, clientpb.ErrorCode(e.Code).String(), e.Message)
}

// Is lets errors.Is match a ModerateError by code: errors.Is(err, sdk.ErrNotModerator).
func (e *ModerateError) Is(target error) bool {
	t, ok := target.(*ModerateError)
	return ok && t.Code == e.Code
}

// Moderate errors to match with errors.Is.
var (
	// ErrNotModerator: this member is not a moderator of the room.
	ErrNotModerator = &ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_NOT_MODERATOR)}
	// ErrOutsideScope: the member named is outside this moderator's scope.
	ErrOutsideScope = &ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_OUTSIDE_SCOPE)}
	// ErrMemberNotFound: the member named has no session in the room.
	ErrMemberNotFound = &ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND)}
)

// moderate sends a moderate request on the current connection and waits for its answer: the
// member's sessions in the room (MUTE, UNMUTE) or the sessions closed (REMOVE).
func (c *Client) moderate(ctx context.Context, req *clientpb.ModerateRequest) (int64, error) {
	what := "moderate " + req.Op.String()
	return onConn(c, ctx, what, func(cur *conn) (int64, error) {
		r := cur.request(ctx, what, func(seq uint64) *clientpb.Frame {
			req.Seq = seq
			return &clientpb.Frame{Kind: &clientpb.Frame_ModerateRequest{ModerateRequest: req}}
		})
		switch {
		case r.err != nil:
			return 0, r.err
		case r.moderate == nil:
			return 0, fmt.Errorf("%w: a moderate request answered by another frame", ErrProtocol)
		case r.moderate.GetCode() != 0:
			return 0, &ModerateError{Code: r.moderate.GetCode(), Message: r.moderate.GetMessage()}
		}
		return r.moderate.GetAffected(), nil
	})
}

// Mute stops the member uid sending in the room for d (0: until unmuted), as the server API's
// MuteMember does. It returns how many sessions the member has in the room.
func (c *Client) Mute(ctx context.Context, uid string, d time.Duration) (int64, error) {
	if d < 0 || d > 0 && d < time.Millisecond {
		return 0, fmt.Errorf("roomcast: mute %s: duration %v is neither 0 (until unmuted) nor a millisecond or more", uid, d)
	}
	return c.moderate(ctx, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_MUTE, Uid: uid, DurationMs: d.Milliseconds()})
}

// Unmute lifts the member uid's mute in the room. It returns how many sessions the member has
// in the room.
func (c *Client) Unmute(ctx context.Context, uid string) (int64, error) {
	return c.moderate(ctx, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_UNMUTE, Uid: uid})
}

// Remove closes the member uid's sessions in the room (close code 4007 KICKED, with reason; ""
// says "removed by a moderator"), as the server API's Kick does. The member may log in again.
// It returns how many sessions were closed.
func (c *Client) Remove(ctx context.Context, uid, reason string) (int64, error) {
	return c.moderate(ctx, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_REMOVE, Uid: uid, Reason: reason})
}

// RecallAsModerator recalls the message messageID of the room (critical or normal lane: what
// history keeps), as the server API's Recall does: every member gets a RecalledEvent naming
// this member as ByUID. A scoped moderator recalls only the messages of members in its scope
// who are in the room now (ErrOutsideScope, ErrMemberNotFound), not the app server's
// (ErrOutsideScope); a room-wide moderator recalls any. A message history does not hold is a
// ModerateError with code 130 (MESSAGE_NOT_FOUND). A message recalled before is no error.
func (c *Client) RecallAsModerator(ctx context.Context, messageID string) error {
	_, err := c.moderate(ctx, &clientpb.ModerateRequest{Op: clientpb.ModerateOp_MODERATE_OP_RECALL, MessageId: messageID})
	return err
}
