package chatlink

import (
	"bufio"
	"errors"
	"strings"
	"testing"
)

func TestReadUpgrade(t *testing.T) {
	const good = "GET /v1/ws?x=1 HTTP/1.1\r\nHost: h\r\nupgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	long := "Cookie: " + strings.Repeat("c", 3000) + "\r\n"
	read := func(s string) error {
		req, err := readUpgrade(bufio.NewReaderSize(strings.NewReader(s), wsReadBuffer))
		if err == nil {
			if req.Method != "GET" || req.Header.Get("Upgrade") != "websocket" ||
				req.Header.Get("Sec-WebSocket-Key") != "dGhlIHNhbXBsZSBub25jZQ==" ||
				req.Header.Get("Connection") != "keep-alive, Upgrade" || req.Header.Get("Cookie") != "" {
				t.Errorf("request %q: read as %s %v", s, req.Method, req.Header)
			}
		}
		return err
	}
	for name, s := range map[string]string{
		"plain":               good + "\r\n",
		"LF only":             strings.ReplaceAll(good, "\r\n", "\n") + "\n",
		"long cookie skipped": good + long + "\r\n",
		"long cookie first":   strings.Replace(good, "Host: h\r\n", long, 1) + "\r\n",
	} {
		if err := read(s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := read("GET /other HTTP/1.1\r\n\r\n"); !errors.Is(err, errNotFound) {
		t.Errorf("other path: %v, want errNotFound", err)
	}
	for name, s := range map[string]string{
		"empty":          "",
		"no version":     "GET /v1/ws\r\n\r\n",
		"HTTP/1.0":       "GET /v1/ws HTTP/1.0\r\n\r\n",
		"cut headers":    good,
		"no colon":       "GET /v1/ws HTTP/1.1\r\nHost h\r\n\r\n",
		"folded":         good + " folded\r\n\r\n",
		"too large":      good + strings.Repeat(long, 6) + "\r\n",
		"too many lines": good + strings.Repeat("X: y\r\n", maxUpgradeHeaders+1) + "\r\n",
		"endless line":   "GET /v1/ws HTTP/1.1\r\nCookie: " + strings.Repeat("c", maxUpgradeBytes),
	} {
		if err := read(s); err == nil || errors.Is(err, errNotFound) {
			t.Errorf("%s: err %v, want a malformed-request error", name, err)
		}
	}
}

// TestPolledPendingGrowsWithData: a frame announced large and sent a little at a time is held
// in a buffer about twice what has arrived, not what was announced.
func TestPolledPendingGrowsWithData(t *testing.T) {
	p := &polled{}
	var frames int
	p.feed = func(data []byte) (int, int, readNext) {
		if len(data) < 60000 {
			return 0, 60000, readOn
		}
		frames++
		return 60000, 0, readOn
	}
	chunk := make([]byte, 100)
	if p.consume(chunk) != readOn || cap(p.pending) > 200 {
		t.Fatalf("after 100 bytes of a 60000-byte frame: pending cap %d", cap(p.pending))
	}
	for total := 100; total < 60000; total += 100 {
		if len(p.pending) == cap(p.pending) {
			t.Fatalf("pending full at %d bytes", total)
		}
		data := append(p.pending, chunk...)
		if p.consume(data) != readOn {
			t.Fatal("consume stopped")
		}
		if frames == 0 && cap(p.pending) > 2*len(p.pending)+pendingMin {
			t.Fatalf("pending cap %d for %d bytes", cap(p.pending), len(p.pending))
		}
	}
	if frames != 1 || p.pending != nil {
		t.Fatalf("frames %d, pending %d bytes", frames, len(p.pending))
	}
}

// TestClaimFresh: while a node has no member of a room, one login at a time asks for the
// room's settings fresh from the store.
func TestClaimFresh(t *testing.T) {
	rt := newRoomTable(nil)
	if !rt.claimFresh("a", "r") {
		t.Fatal("first login of a room did not claim")
	}
	if rt.claimFresh("a", "r") {
		t.Fatal("a second login claimed while the first one's join is in flight")
	}
	if !rt.claimFresh("a", "other") {
		t.Fatal("another room's login did not claim")
	}
	rt.unclaimFresh("a", "r") // the first join failed
	if !rt.claimFresh("a", "r") {
		t.Fatal("the login after a failed claim did not claim")
	}
}
