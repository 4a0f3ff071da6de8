package mobile

import (
	"context"
	"errors"

	"roomcast/sdk"
)

// RecallResult answers Recall. A refusal is not an error: ErrorCode says why.
type RecallResult struct {
	// AlreadyRecalled: the message had been recalled before (by anyone).
	AlreadyRecalled bool
	// ErrorCode is 0 when the message was recalled, else why not: ErrorMessageNotFound (130),
	// ErrorRecallNotAllowed (131), ErrorRecallWindowPassed (132), ErrorBadRequest (100),
	// ErrorUnavailable (503).
	ErrorCode int32
	// ErrorMessage is the server's explanation of a refusal.
	ErrorMessage string
}

// Recall recalls a message this member sent (SendResult.MessageID), if the room lets members
// recall theirs and the message is young enough. Every member gets an EventRecalled. It returns
// an error only when the request could not be made (closed, timed out).
func (c *Client) Recall(messageID string) (*RecallResult, error) {
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	already, err := c.c.Recall(ctx, messageID)
	if se := (*sdk.SendError)(nil); errors.As(err, &se) {
		return &RecallResult{ErrorCode: int32(se.Code), ErrorMessage: se.Message}, nil
	}
	if err != nil {
		return nil, err
	}
	return &RecallResult{AlreadyRecalled: already}, nil
}
