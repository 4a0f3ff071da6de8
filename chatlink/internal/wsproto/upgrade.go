package wsproto

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
)

// Limits of a WebSocket upgrade request.
const (
	maxUpgradeBytes   = 16 << 10 // request line and headers together
	maxUpgradeHeaders = 100
)

// ErrNotFound is ReadUpgrade's answer to a request for another path.
var ErrNotFound = errors.New("wsproto: not found")

// upgradeHeaders are the request headers gws reads to answer an upgrade, and the forwarding
// headers a trusted proxy names the client in, in the canonical form http.Header.Get looks
// up; ReadUpgrade keeps only these.
var upgradeHeaders = []string{
	"Connection", "Upgrade", "Sec-Websocket-Key", "Sec-Websocket-Version",
	"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "X-Forwarded-For", "X-Real-Ip",
}

// ReadUpgrade reads a WebSocket upgrade request for path (GET /v1/ws, say) off br. It keeps
// only the headers gws needs and skips the rest without copying them: net/http's parser would
// build the URL and every header (cookies, user agent) only to have them dropped, about 0.7 KB
// of garbage per login. It returns ErrNotFound for another path, and an error for anything
// that is not an HTTP/1.1 request within the limits above. Any method is returned: gws
// refuses all but GET.
func ReadUpgrade(br *bufio.Reader, path string) (*http.Request, error) {
	budget := maxUpgradeBytes
	line, err := readHeaderLine(br, &budget)
	if err != nil {
		return nil, err
	}
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 || !bytes.Equal(proto, []byte("HTTP/1.1")) {
		return nil, errors.New("wsproto: malformed request line")
	}
	if p, _, _ := bytes.Cut(target, []byte("?")); string(p) != path {
		return nil, ErrNotFound
	}
	req := &http.Request{Method: string(method), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(upgradeHeaders))}
	for n := 0; ; n++ {
		if n > maxUpgradeHeaders {
			return nil, errors.New("wsproto: too many headers")
		}
		line, err := readHeaderLine(br, &budget)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			// A line longer than the buffer: a header gws does not need (cookies, say), or
			// one too long for it to accept anyway. Skip it.
			if err := skipLine(br, &budget); err != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, err
		case len(line) == 0:
			return req, nil
		case line[0] == ' ' || line[0] == '\t':
			return nil, errors.New("wsproto: folded header line")
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 {
			return nil, errors.New("wsproto: malformed header line")
		}
		for _, h := range upgradeHeaders {
			if len(name) == len(h) && bytes.EqualFold(name, []byte(h)) {
				req.Header[h] = append(req.Header[h], string(bytes.TrimSpace(value)))
				break
			}
		}
	}
}

// readHeaderLine returns the next line without its CRLF (or LF), as a slice into br's buffer
// that is valid until the next read. A line longer than the buffer returns
// bufio.ErrBufferFull, with its first part consumed.
func readHeaderLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if *budget -= len(line); *budget < 0 {
		return nil, errors.New("wsproto: upgrade request too large")
	}
	if err != nil {
		return nil, err
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
	return line, nil
}

// skipLine consumes the rest of a line that overflowed the buffer.
func skipLine(br *bufio.Reader, budget *int) error {
	for {
		part, err := br.ReadSlice('\n')
		if *budget -= len(part); *budget < 0 {
			return errors.New("wsproto: upgrade request too large")
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}
