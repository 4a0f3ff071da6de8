package wsproto

import (
	"bufio"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestReadUpgrade(t *testing.T) {
	const good = "GET /v1/ws?x=1 HTTP/1.1\r\nHost: h\r\nupgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	long := "Cookie: " + strings.Repeat("c", 3000) + "\r\n"
	read := func(s string) error {
		req, err := ReadUpgrade(bufio.NewReaderSize(strings.NewReader(s), 256), "/v1/ws")
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
	if err := read("GET /other HTTP/1.1\r\n\r\n"); !errors.Is(err, ErrNotFound) {
		t.Errorf("other path: %v, want ErrNotFound", err)
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
		if err := read(s); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("%s: err %v, want a malformed-request error", name, err)
		}
	}
}

func FuzzReadUpgrade(f *testing.F) {
	f.Add("GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	f.Add("GET /v1/ws HTTP/1.1\r\nCookie: " + strings.Repeat("c", 600) + "\r\n\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		req, err := ReadUpgrade(bufio.NewReaderSize(strings.NewReader(s), 256), "/v1/ws")
		if err != nil {
			return
		}
		for name := range req.Header {
			if !slices.Contains(upgradeHeaders, name) {
				t.Fatalf("kept header %q, which gws does not read", name)
			}
		}
	})
}
