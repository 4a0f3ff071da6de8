package roomstore

import (
	"fmt"
	"time"
	"unicode/utf8"

	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// Limits on what a room accepts from a sender: the room service enforces them, the server API
// checks them before it asks (CheckSend).
const (
	MaxBodyBytes = 16 << 10
	MaxTypeBytes = 32
	// MaxBatch bounds the messages of one batch send.
	MaxBatch = 100
	// MaxMemberBatch bounds the members' sends a ChatLink carries to a room in one request
	// (a window's; the rest wait for the next).
	MaxMemberBatch = 1000
	// MaxTagMutes bounds the tag mutes a room holds: each member's send is checked against all
	// of them.
	MaxTagMutes = 16
)

// CheckSend checks a send request against the room's limits, all but its tag expression (which
// takes a compiler: the room service's). It returns nil when the request is acceptable,
// otherwise the reply to give.
func CheckSend(req *buspb.SendRequest) *buspb.Reply {
	bad := func(code clientpb.ErrorCode, format string, args ...any) *buspb.Reply {
		return &buspb.Reply{Code: uint32(code), Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case req.App == "" || req.Room == "":
		return bad(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "app and room are required")
	case len(req.Body) == 0:
		return bad(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "body is empty")
	case len(req.Body) > MaxBodyBytes:
		return bad(clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, "body is %d bytes, the limit is %d", len(req.Body), MaxBodyBytes)
	case len(req.Type) > MaxTypeBytes || !utf8.ValidString(req.Type):
		return bad(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "type must be valid UTF-8 of at most %d bytes", MaxTypeBytes)
	case req.Lane < clientpb.Lane_LANE_UNSPECIFIED || req.Lane > clientpb.Lane_LANE_BULK:
		return bad(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown lane %d", req.Lane)
	}
	return nil
}

// TagMuteHolds reports whether a room's tag mute still holds at now.
func TagMuteHolds(m *apipb.TagMute, now time.Time) bool {
	return m.UntilMs == 0 || now.UnixMilli() < m.UntilMs
}
