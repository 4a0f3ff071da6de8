package callback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The headers of a callback request.
const (
	// HeaderTimestamp carries the request's time, in Unix seconds (decimal).
	HeaderTimestamp = "Roomcast-Timestamp"
	// HeaderSignature carries "v1=" and the lowercase hex HMAC-SHA256, keyed with the app's
	// secret, of the signing string: the timestamp header's value, a ".", and the raw body.
	HeaderSignature = "Roomcast-Signature"
	// HeaderHook names the hook: "login" or "send" (also in the body).
	HeaderHook = "Roomcast-Hook"
)

// ReplayWindow is how far a request's timestamp may be from the receiver's clock for Verify to
// accept it; a receiver that also remembers the ids (the body's "id") of that long refuses
// every replay.
const ReplayWindow = 5 * time.Minute

// Sign returns the HeaderSignature value of a request with body sent at Unix time ts.
func Sign(secret []byte, ts int64, body []byte) string {
	return "v1=" + hex.EncodeToString(mac(secret, strconv.FormatInt(ts, 10), body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte("."))
	h.Write(body)
	return h.Sum(nil)
}

// Errors of Verify.
var (
	ErrBadSignature = errors.New("callback: signature does not match")
	ErrStale        = errors.New("callback: timestamp outside the replay window")
)

// Verify checks a request an app received: the values of its HeaderTimestamp and
// HeaderSignature, and its raw body, with the app's secret at time now. It is what an app
// written in Go may call (docs/callbacks.md shows the same with the standard library only).
func Verify(secret []byte, timestamp, signature string, body []byte, now time.Time) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrBadSignature
	}
	if d := now.Sub(time.Unix(ts, 0)); d > ReplayWindow || d < -ReplayWindow {
		return ErrStale
	}
	got, err := hex.DecodeString(strings.TrimPrefix(signature, "v1="))
	if err != nil || !strings.HasPrefix(signature, "v1=") || !hmac.Equal(got, mac(secret, timestamp, body)) {
		return ErrBadSignature
	}
	return nil
}
