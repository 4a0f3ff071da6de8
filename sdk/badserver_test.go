package sdk_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// badServers are ChatLinks that misbehave in the ways a client must survive, and the error a
// client should report for each.
var badServers = []struct {
	name    string
	atLogin bool             // the fault comes before the login succeeds: Dial fails
	serve   func(c fakeConn) // after the Login was read
	want    func(error) bool // the error an event (and Dial) reports
}{
	{"garbage after the login", false, func(c fakeConn) {
		acceptLoginAck(c, 0)
		_ = c.sendPayload([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // a tag that overflows
		waitGone(c)
	}, func(err error) bool { return errors.Is(err, sdk.ErrProtocol) }},
	{"closes mid-frame", true, func(c fakeConn) {
		// A frame header that promises 256 bytes (TCP length prefix; WebSocket binary frame with
		// a 16-bit length) and then only 3 of them.
		if _, ws := c.(*wsFake); ws {
			_ = c.wire([]byte{0x82, 0x7e, 0x01, 0x00, 1, 2, 3})
		} else {
			_ = c.wire([]byte{0, 0, 1, 0, 1, 2, 3})
		}
		c.close()
	}, func(err error) bool {
		var ce *sdk.CloseError
		return errors.As(err, &ce) && ce.Code == sdk.CodeAbnormalClosure
	}},
	{"never answers the login", true, func(c fakeConn) { waitGone(c) },
		func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
	{"wrong version", true, func(c fakeConn) {
		acceptLoginAck(c, 2)
		waitGone(c)
	}, func(err error) bool { return errors.Is(err, sdk.ErrVersion) && errors.Is(err, sdk.ErrProtocol) }},
}

// acceptLoginAck answers the Login that was read with a LoginAck of protocol version v.
func acceptLoginAck(c fakeConn, v uint32) {
	_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{
		SessionId: "bad-1", ServerTimeMs: time.Now().UnixMilli(), HeartbeatIntervalMs: 60000, ProtocolVersion: v,
	}}})
}

// waitGone reads until the client goes away.
func waitGone(c fakeConn) {
	for {
		if _, err := c.recv(); err != nil {
			return
		}
	}
}

// TestBadServers: against a server that sends garbage, closes mid-frame, never answers the login
// or answers with a protocol version the SDK does not speak, Dial fails with a clear error; and
// a Client whose server turns bad after a good session reports the error in an event, keeps
// trying with a growing backoff (no tight loop), and closes cleanly.
func TestBadServers(t *testing.T) {
	for _, bad := range badServers {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			forEachTransport(t, func(t *testing.T, transport string) {
				testBadServer(t, transport, bad.atLogin, bad.serve, bad.want)
			})
		})
	}
}

func testBadServer(t *testing.T, transport string, atLogin bool, serve func(fakeConn), want func(error) bool) {
	var conns atomic.Int32
	good := make(chan struct{}) // closed: the good session is over
	link := startFakeLink(t, func(c fakeConn) {
		if conns.Add(1) == 1 {
			if _, err := acceptLogin(c, "cl-1", time.Minute); err != nil {
				return
			}
			_ = c.send(pushFrame(&clientpb.Message{Id: "01KB0000000000000000000001", Body: []byte("hello")}))
			<-good
			return // closes the connection: a transient end
		}
		if _, err := c.recv(); err != nil { // the Login
			return
		}
		serve(c)
	})
	rec := newRecorder()
	cfg := rec.config(sdk.Config{
		AttemptTimeout: 150 * time.Millisecond, ReconnectMinDelay: 100 * time.Millisecond, ReconnectMaxDelay: 400 * time.Millisecond,
	})
	c, err := dialFake(t, transport, cfg, link)
	if err != nil {
		t.Fatal(err)
	}
	close(good)
	const window = 1500 * time.Millisecond
	time.Sleep(window) // the time over which attempts are counted
	attempts := conns.Load() - 1
	c.Close()
	if err := rec.waitClosed(t, time.Second); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("closed with %v, want ErrClosed", err)
	}

	// Backoff from 50–100ms up to 200–400ms, plus each attempt's own time: at most about 8 in
	// the window; a tight loop would make hundreds.
	if attempts < 2 || attempts > 10 {
		t.Errorf("%d attempts in %v, want 2 to 10: %q", attempts, window, rec.order())
	}
	var errs []error
	for _, e := range all[*sdk.ErrorEvent](rec) {
		errs = append(errs, e.Err)
	}
	for _, e := range all[*sdk.ReconnectingEvent](rec) {
		errs = append(errs, e.Err)
	}
	found := false
	for _, err := range errs {
		found = found || want(err)
	}
	if !found {
		t.Errorf("no event names the fault; errors reported: %v", errs)
	}
	t.Logf("%d attempts; first error: %v", attempts, errors.Join(errs[:min(1, len(errs))]...))

	if !atLogin {
		return
	}
	// Dial against the bad server fails with the same clear error.
	_, err = dialFake(t, transport, sdk.Config{AttemptTimeout: 150 * time.Millisecond}, link)
	if err == nil || !want(err) {
		t.Errorf("Dial: %v", err)
	}
}
