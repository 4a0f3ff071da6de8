package sdk_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// TestLimitedLoginsWaitAndRetry: ten members log in at once to a room whose join rate lets
// two at once and five a second after; the eight refused with Kick 4013 wait the server's hint (a LimitedEvent
// each) and all end up logged in, through the dispatcher.
func TestLimitedLoginsWaitAndRetry(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.JoinsPerRoom = ratelimit.Limit{Rate: 5, Burst: 2}
	})
	forEachTransport(t, func(t *testing.T, transport string) {
		const members = 10
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			limited []*sdk.LimitedEvent
		)
		for i := range members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tok, err := c.Mint("m"+string(rune('a'+i)), "crowd-"+transport, nil, time.Hour)
				if err != nil {
					t.Error(err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				connected := make(chan struct{})
				cl, err := sdk.Dial(ctx, sdk.Config{
					Token: tok, Dispatcher: c.URL(), Transport: transport,
					OnEvent: func(e sdk.Event) {
						switch e := e.(type) {
						case *sdk.LimitedEvent:
							mu.Lock()
							limited = append(limited, e)
							mu.Unlock()
						case *sdk.ConnectedEvent:
							close(connected) // after the Dial's LimitedEvents
						}
					},
				})
				if err != nil {
					t.Errorf("member %d: %v", i, err)
					return
				}
				<-connected
				cl.Close()
			}()
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(limited) < members-2 {
			t.Errorf("%d LimitedEvents, want at least %d (one per member over the burst)", len(limited), members-2)
		}
		for _, l := range limited {
			if l.Code != uint32(clientpb.CloseCode_CLOSE_CODE_LOGIN_RATE_LIMITED) || l.RetryAfter <= 0 || l.RetryAfter > time.Second || l.Delay < l.RetryAfter {
				t.Errorf("LimitedEvent %+v: want code 4013, a hint within 1s and a delay no shorter", l)
			}
		}
	})
}

// TestDeniedAddressStops: a client whose address is on the node's deny list is refused with
// 4014 (HTTP 403 before the WebSocket upgrade, a Kick over TCP) and does not try again.
func TestDeniedAddressStops(t *testing.T) {
	t.Parallel()
	list := filepath.Join(t.TempDir(), "ips")
	if err := os.WriteFile(list, []byte("deny 127.0.0.0/8\ndeny ::1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.IPListFile = list
	})
	forEachTransport(t, func(t *testing.T, transport string) {
		tok, err := c.Mint("denied", "lobby", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err = sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL(), Transport: transport})
		var ce *sdk.CloseError
		if !errors.As(err, &ce) || ce.Code != uint32(clientpb.CloseCode_CLOSE_CODE_ADDRESS_DENIED) || !ce.Terminal() {
			t.Fatalf("Dial: %v; want a terminal CloseError 4014", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Dial took %v to give up: it should stop at once", d)
		}
	})
}

// TestSendRateLimited: a Send over the connection's rate returns a temporary *SendError 120
// with the server's retry hint; the same Send after the hint is accepted.
func TestSendRateLimited(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.SendsPerConn = ratelimit.Limit{Rate: 5, Burst: 1}
	})
	cl := dialCluster(t, c, sdk.TransportWebSocket, "fast", "rated", sdk.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := sdk.Outgoing{Type: "chat", Body: []byte("hi")}
	if _, err := cl.Send(ctx, m); err != nil {
		t.Fatal(err)
	}
	_, err := cl.Send(ctx, m)
	var se *sdk.SendError
	if !errors.As(err, &se) || se.Code != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) || !se.Temporary() ||
		se.RetryAfter <= 0 || se.RetryAfter > 200*time.Millisecond {
		t.Fatalf("second Send: %v; want a temporary SendError 120 with a hint within 200ms", err)
	}
	time.Sleep(se.RetryAfter)
	if _, err := cl.Send(ctx, m); err != nil {
		t.Fatalf("Send after the hint: %v", err)
	}
}

// TestRefusedUpgrade: the ChatLink's answers to an upgrade it refuses name the close code and,
// for 4015, when to come back; other answers are not a CloseError.
func TestRefusedUpgrade(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status        int
		code, retryAt string
		want          *sdk.CloseError
	}{
		{http.StatusTooManyRequests, "4015", "2", &sdk.CloseError{Code: 4015, RetryAfter: 2 * time.Second}},
		{http.StatusForbidden, "4014", "", &sdk.CloseError{Code: 4014}},
		{http.StatusForbidden, "4014", "2", &sdk.CloseError{Code: 4014}}, // a hint only with a limited code
		{http.StatusBadRequest, "", "", nil},
		{http.StatusTooManyRequests, "1006", "2", nil},
	} {
		resp := &http.Response{StatusCode: tc.status, Status: http.StatusText(tc.status), Header: http.Header{}}
		if tc.code != "" {
			resp.Header.Set("Roomcast-Close-Code", tc.code)
		}
		if tc.retryAt != "" {
			resp.Header.Set("Retry-After", tc.retryAt)
		}
		got := sdk.RefusedUpgrade(resp)
		if (got == nil) != (tc.want == nil) || got != nil && (got.Code != tc.want.Code || got.RetryAfter != tc.want.RetryAfter) {
			t.Errorf("%d %s Retry-After %q: %+v, want %+v", tc.status, tc.code, tc.retryAt, got, tc.want)
		}
	}
	if ce := sdk.RefusedUpgrade(nil); ce != nil {
		t.Errorf("no response: %v", ce)
	}
}
