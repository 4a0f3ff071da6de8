package mobile

import (
	"context"
	"errors"
	"time"

	"roomcast/sdk"
)

// Moderators in the room (docs/protocol.md, "Moderators"): a member whose tags satisfy the
// room's moderator_expr mutes, unmutes and removes the members of its class (those sharing its
// tags that start with the room's moderator_scope_prefix), and recalls their messages; one whose
// tags satisfy moderator_room_expr, every member.

// ModerateResult is the server's answer to a moderate request: how many of the member's sessions
// it concerned, or a refusal with its code (the connection stays up).
type ModerateResult struct {
	// Sessions: for Mute and Unmute, the member's sessions in the room; for Remove, the sessions
	// closed; for RecallAsModerator, 1 (the message recalled). 0 with a refusal.
	Sessions int64
	// ErrorCode is 0 when the request was applied, else why it was refused: ErrorNotModerator,
	// ErrorOutsideScope, ErrorUserNotFound (no session in the room), ErrorBadRequest,
	// ErrorRoomNotFound, ErrorSendRateLimited (over the connection's moderate rate),
	// ErrorMessageNotFound (RecallAsModerator) or ErrorUnavailable.
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
}

// moderate runs one request of the Go SDK's and converts its answer: a ModerateError is a result.
func (c *Client) moderate(do func(ctx context.Context) (int64, error)) (*ModerateResult, error) {
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	n, err := do(ctx)
	if me := (*sdk.ModerateError)(nil); errors.As(err, &me) {
		return &ModerateResult{ErrorCode: int32(me.Code), ErrorMessage: me.Message}, nil
	}
	if err != nil {
		return nil, err
	}
	return &ModerateResult{Sessions: n}, nil
}

// Mute stops the member uid sending in the room for durationMs milliseconds (0: until unmuted).
// Each moderate call waits for the server's answer, at most Config.SendTimeoutMs; a refusal is a
// result, the error is for no answer or a negative duration.
func (c *Client) Mute(uid string, durationMs int64) (*ModerateResult, error) {
	return c.moderate(func(ctx context.Context) (int64, error) {
		return c.c.Mute(ctx, uid, time.Duration(durationMs)*time.Millisecond)
	})
}

// Unmute lifts the member uid's mute in the room.
func (c *Client) Unmute(uid string) (*ModerateResult, error) {
	return c.moderate(func(ctx context.Context) (int64, error) { return c.c.Unmute(ctx, uid) })
}

// Remove closes the member uid's sessions in the room (close code 4007, CloseKicked, with
// reason; "" says "removed by a moderator"). The member may log in again.
func (c *Client) Remove(uid, reason string) (*ModerateResult, error) {
	return c.moderate(func(ctx context.Context) (int64, error) { return c.c.Remove(ctx, uid, reason) })
}

// RecallAsModerator recalls the message messageID of the room (critical or normal lane: what
// history keeps); every member gets an EventRecalled naming this member. A scoped moderator
// recalls only the messages of members of its class who are in the room now (ErrorOutsideScope,
// ErrorUserNotFound), not the app server's (ErrorOutsideScope); a room-wide moderator recalls
// any. A message the room's history does not hold is ErrorMessageNotFound. On success Sessions
// is 1 (also for a message recalled before).
func (c *Client) RecallAsModerator(messageID string) (*ModerateResult, error) {
	return c.moderate(func(ctx context.Context) (int64, error) {
		if err := c.c.RecallAsModerator(ctx, messageID); err != nil {
			return 0, err
		}
		return 1, nil
	})
}
