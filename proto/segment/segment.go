// Package segment is the CDN segment's format (docs/cdn.md): where a segment lives (Key, URL,
// Index), how the pusher writes it (Encode) and how a client reads one it fetched (Decode). The
// pusher and the Go SDK both import it, so it must import nothing of Roomcast but
// proto/clientpb, and nothing else but the protobuf runtime, klauspost/compress (which the
// SDK's WebSocket library brings anyway) and the standard library: no storage, bus or server
// component.
package segment

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// The headers a segment object is stored with: a browser's fetch (and Go's http.Client, when it
// asked for gzip itself) undoes the gzip before the caller sees the body; CDNs may cache it
// forever because a segment never changes once written.
const (
	ContentType     = "application/x-protobuf"
	ContentEncoding = "gzip"
	CacheControl    = "public, max-age=31536000, immutable"
)

// MaxDecoded is the most bytes Decode inflates a segment to. A pusher's segment holds at most
// its cap of messages (200 by default), far below this; anything larger is refused rather than
// read into memory.
const MaxDecoded = 8 << 20

// Index is the window of a message stamped at serverTimeMs: floor(serverTimeMs / windowMs).
// Negative times (before 1970) round down too, so windows never overlap.
func Index(serverTimeMs int64, windowMs uint32) int64 {
	w := int64(windowMs)
	i := serverTimeMs / w
	if serverTimeMs%w < 0 {
		i--
	}
	return i
}

// Key is the object key of a segment under a storage prefix: {app}/{room}/{window_ms}/{index}.
// App and room are 1 to 128 characters of A-Z a-z 0-9 _ - (the pusher refuses others), so
// they need no escaping.
func Key(app, room string, windowMs uint32, index int64) string {
	return app + "/" + room + "/" + strconv.FormatUint(uint64(windowMs), 10) + "/" + strconv.FormatInt(index, 10)
}

// URL fills a vendor's URL template (CdnVendor.url_template): {app}, {room}, {window_ms} and
// {index} are replaced; anything else is kept as written.
func URL(template, app, room string, windowMs uint32, index int64) string {
	return strings.NewReplacer(
		"{app}", app,
		"{room}", room,
		"{window_ms}", strconv.FormatUint(uint64(windowMs), 10),
		"{index}", strconv.FormatInt(index, 10),
	).Replace(template)
}

var writers = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// Encode returns s as stored: the protobuf encoding of s, gzip-compressed.
func Encode(s *clientpb.Segment) ([]byte, error) {
	raw, err := proto.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("segment: marshal: %w", err)
	}
	var buf bytes.Buffer
	buf.Grow(len(raw)/2 + 64)
	zw := writers.Get().(*gzip.Writer)
	defer writers.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, fmt.Errorf("segment: gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("segment: gzip: %w", err)
	}
	return buf.Bytes(), nil
}

// ErrInvalid wraps every reason Decode refuses a segment.
var ErrInvalid = errors.New("segment: invalid")

// Want is the segment a client asked for; Decode refuses any other.
type Want struct {
	App      string
	Room     string
	WindowMs uint32
	Index    int64
}

// gzipMagic starts every gzip stream. A protobuf encoding never starts with 0x1f: that would be
// field 3 with wire type 7, which does not exist.
var gzipMagic = []byte{0x1f, 0x8b}

// Decode reads a fetched segment: body is either the stored gzip bytes or, when an HTTP client
// already undid the Content-Encoding, the protobuf bytes themselves. It refuses (with an error
// wrapping ErrInvalid) a body that inflates beyond MaxDecoded, is not a Segment, or is a segment
// of another app, room, window length or index; and a message in it that belongs to another
// room or carries a tag expression.
func Decode(body []byte, want Want) (*clientpb.Segment, error) {
	raw := body
	if bytes.HasPrefix(body, gzipMagic) {
		var err error
		if raw, err = gunzip(body); err != nil {
			return nil, err
		}
	} else if len(body) > MaxDecoded {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalid, len(body), MaxDecoded)
	}
	var s clientpb.Segment
	if err := proto.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch {
	case s.App != want.App || s.Room != want.Room:
		return nil, fmt.Errorf("%w: segment of %s/%s, asked for %s/%s", ErrInvalid, s.App, s.Room, want.App, want.Room)
	case s.WindowMs != want.WindowMs || s.Index != want.Index:
		return nil, fmt.Errorf("%w: segment %d/%d, asked for %d/%d", ErrInvalid, s.WindowMs, s.Index, want.WindowMs, want.Index)
	}
	for _, m := range s.Messages {
		switch {
		case m == nil || m.Id == "":
			return nil, fmt.Errorf("%w: a message without an id", ErrInvalid)
		case m.Room != "" && m.Room != want.Room:
			return nil, fmt.Errorf("%w: message %s of room %s", ErrInvalid, m.Id, m.Room)
		case m.TagExpr != "":
			return nil, fmt.Errorf("%w: message %s has a tag expression", ErrInvalid, m.Id)
		}
	}
	return &s, nil
}

func gunzip(body []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: gzip: %v", ErrInvalid, err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, MaxDecoded+1))
	if err != nil {
		return nil, fmt.Errorf("%w: gzip: %v", ErrInvalid, err)
	}
	if len(raw) > MaxDecoded {
		return nil, fmt.Errorf("%w: inflates beyond %d bytes", ErrInvalid, MaxDecoded)
	}
	return raw, nil
}
