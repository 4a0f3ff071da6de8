package mobile

import (
	"testing"

	"roomcast/proto/clientpb"
)

// TestErrorCodesMatchTheProtocol: the facade's named error codes are the protocol's.
func TestErrorCodesMatchTheProtocol(t *testing.T) {
	for got, want := range map[int]clientpb.ErrorCode{
		ErrorSendRateLimited: clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED,
		ErrorLaneNotAllowed:  clientpb.ErrorCode_ERROR_CODE_LANE_NOT_ALLOWED,
	} {
		if got != int(want) {
			t.Errorf("%d is not %v (%d)", got, want, want)
		}
	}
}
