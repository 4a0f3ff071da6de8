package sdk

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// tokenClaims are the claims of a login token the client needs to ask the dispatcher.
type tokenClaims struct {
	App  string `json:"app"`
	UID  string `json:"uid"`
	Room string `json:"room"`
}

// readClaims decodes the payload of a JWT without verifying its signature: the client only
// needs to know where to connect, and the ChatLink verifies the token anyway.
func readClaims(token string) (tokenClaims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return tokenClaims{}, fmt.Errorf("%w: want 3 dot-separated parts, got %d", ErrBadToken, len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return tokenClaims{}, fmt.Errorf("%w: payload: %w", ErrBadToken, err)
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		return tokenClaims{}, fmt.Errorf("%w: claims: %w", ErrBadToken, err)
	}
	if c.App == "" || c.UID == "" || c.Room == "" {
		return tokenClaims{}, fmt.Errorf("%w: app, uid and room claims are required", ErrBadToken)
	}
	return c, nil
}

// Dispatch asks the dispatcher at base which ChatLinks the holder of token should try, best
// first, as Dial does before it connects; hc's connection is kept for reuse. It is for tools
// that speak the protocol themselves (the load generator's raw clients).
// The list is never empty without an error.
func Dispatch(ctx context.Context, hc *http.Client, base, token string) ([]Endpoint, error) {
	return dispatchToken(ctx, hc, false, base, token)
}

// dispatchToken reads token's claims and dispatches them (see dispatch); an empty answer is
// ErrNoEndpoints.
func dispatchToken(ctx context.Context, hc *http.Client, closeConn bool, base, token string) ([]Endpoint, error) {
	c, err := readClaims(token)
	if err != nil {
		return nil, err
	}
	eps, _, err := dispatch(ctx, hc, closeConn, base, c)
	if err == nil && len(eps) == 0 {
		err = fmt.Errorf("%w: the dispatcher returned none", ErrNoEndpoints)
	}
	return eps, err
}

// dispatchAnswer is the dispatcher's JSON answer (docs/protocol.md §1).
type dispatchAnswer struct {
	Nodes []Endpoint `json:"nodes"`
	TTLMS int64      `json:"ttl_ms"`
	Error string     `json:"error"`
}

// maxDispatchBody bounds how much of a dispatcher answer is read.
const maxDispatchBody = 1 << 20

// dispatch asks the dispatcher at base which ChatLinks to try for claims, best first, and for
// how long the list may be reused. With closeConn the request asks for its connection to be
// closed after the answer, else hc's Transport may keep it for the next request.
func dispatch(ctx context.Context, hc *http.Client, closeConn bool, base string, c tokenClaims) ([]Endpoint, time.Duration, error) {
	q := url.Values{"app": {c.App}, "room": {c.Room}, "uid": {c.UID}}
	u := strings.TrimRight(base, "/") + "/v1/dispatch?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("roomcast: dispatch: %w", err)
	}
	req.Close = closeConn
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("roomcast: dispatch: %w", err)
	}
	defer resp.Body.Close()
	// Read to the end (an answer is far below the limit), so that a kept connection can be
	// reused.
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDispatchBody))
	if err != nil {
		return nil, 0, fmt.Errorf("roomcast: dispatch: reading answer: %w", err)
	}
	var a dispatchAnswer
	jsonErr := json.Unmarshal(body, &a)
	if resp.StatusCode != http.StatusOK {
		msg := a.Error
		if jsonErr != nil || msg == "" {
			msg = strings.TrimSpace(string(body))
		}
		return nil, 0, fmt.Errorf("roomcast: dispatch: %s: %s", resp.Status, msg)
	}
	if jsonErr != nil {
		return nil, 0, fmt.Errorf("roomcast: dispatch: decoding answer: %w", jsonErr)
	}
	return a.Nodes, time.Duration(a.TTLMS) * time.Millisecond, nil
}
