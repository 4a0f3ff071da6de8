package segment

import (
	"bytes"
	"errors"
	"testing"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

var want = Want{App: "app1", Room: "lobby", WindowMs: 1000, Index: 1_764_451_200}

func sample() *clientpb.Segment {
	return &clientpb.Segment{
		App: want.App, Room: want.Room, WindowMs: want.WindowMs, Index: want.Index,
		Messages: []*clientpb.Message{
			{Id: "01KB0000000000000000000001", Room: "lobby", Type: "gift", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("rocket"), ServerTimeMs: 1_764_451_200_900},
			{Id: "01KB0000000000000000000002", Room: "lobby", Sender: "u2", Type: "danmaku", Lane: clientpb.Lane_LANE_BULK, Body: []byte("666"), ServerTimeMs: 1_764_451_200_100},
		},
		Sampled:  7,
		NextAtMs: 1_764_451_202_100,
	}
}

func encode(t testing.TB, s *clientpb.Segment) []byte {
	t.Helper()
	b, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIndexAndKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ms     int64
		window uint32
		index  int64
	}{
		{0, 1000, 0}, {999, 1000, 0}, {1000, 1000, 1}, {1_764_451_200_999, 1000, 1_764_451_200},
		{1_764_451_201_000, 500, 3_528_902_402}, {-1, 1000, -1}, {-1000, 1000, -1}, {-1001, 1000, -2},
	} {
		if got := Index(tc.ms, tc.window); got != tc.index {
			t.Errorf("Index(%d, %d) = %d, want %d", tc.ms, tc.window, got, tc.index)
		}
	}
	if got := Key("app1", "lobby", 1000, 42); got != "app1/lobby/1000/42" {
		t.Errorf("Key = %q", got)
	}
	tmpl := "https://cdn.example.com/rc/{app}/{room}/{window_ms}/{index}?v=1"
	if got := URL(tmpl, "app1", "lobby", 1000, 42); got != "https://cdn.example.com/rc/app1/lobby/1000/42?v=1" {
		t.Errorf("URL = %q", got)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	s := sample()
	b := encode(t, s)
	if !bytes.HasPrefix(b, gzipMagic) {
		t.Fatalf("encoded segment is not gzip: % x", b[:4])
	}
	got, err := Decode(b, want)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, s) {
		t.Fatalf("decoded %v, want %v", got, s)
	}
	// An HTTP client that undid the Content-Encoding hands over the protobuf itself.
	raw, _ := proto.Marshal(s)
	if got, err := Decode(raw, want); err != nil || !proto.Equal(got, s) {
		t.Fatalf("plain protobuf: %v, %v", got, err)
	}
	// An empty segment (a quiet window) is valid.
	empty := &clientpb.Segment{App: want.App, Room: want.Room, WindowMs: want.WindowMs, Index: want.Index}
	if got, err := Decode(encode(t, empty), want); err != nil || len(got.Messages) != 0 {
		t.Fatalf("empty segment: %v, %v", got, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	good := encode(t, sample())
	with := func(edit func(s *clientpb.Segment)) []byte {
		s := sample()
		edit(s)
		return encode(t, s)
	}
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write(make([]byte, MaxDecoded+1))
	_ = zw.Close()
	for name, body := range map[string][]byte{
		"garbage":        []byte("<html>404 not found</html>"),
		"truncated gzip": good[:len(good)/2],
		"gzip of garbage": func() []byte {
			var b bytes.Buffer
			zw := gzip.NewWriter(&b)
			_, _ = zw.Write([]byte{0xff, 0xff, 0xff})
			_ = zw.Close()
			return b.Bytes()
		}(),
		"other app":             with(func(s *clientpb.Segment) { s.App = "app2" }),
		"other room":            with(func(s *clientpb.Segment) { s.Room = "hall" }),
		"other window":          with(func(s *clientpb.Segment) { s.WindowMs = 500 }),
		"other index":           with(func(s *clientpb.Segment) { s.Index++ }),
		"message of other room": with(func(s *clientpb.Segment) { s.Messages[1].Room = "hall" }),
		"targeted message":      with(func(s *clientpb.Segment) { s.Messages[0].TagExpr = "class == 'a'" }),
		"message without id":    with(func(s *clientpb.Segment) { s.Messages[0].Id = "" }),
		"inflates too far":      bomb.Bytes(),
	} {
		if _, err := Decode(body, want); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// FuzzSegmentDecode: whatever a CDN hands back, Decode returns an error or a segment that is
// the one asked for and survives a round trip; it never panics.
func FuzzSegmentDecode(f *testing.F) {
	good, err := Encode(sample())
	if err != nil {
		f.Fatal(err)
	}
	raw, _ := proto.Marshal(sample())
	foreign := sample()
	foreign.Room = "hall"
	foreignBytes, _ := Encode(foreign)
	emptyBytes, _ := Encode(&clientpb.Segment{App: want.App, Room: want.Room, WindowMs: want.WindowMs, Index: want.Index})
	for _, seed := range [][]byte{
		good, raw, foreignBytes, emptyBytes,
		good[:len(good)/2], good[:11], raw[:len(raw)-3],
		{}, gzipMagic, []byte("<html>404 not found</html>"), []byte("\x1f\x8b\x08\x00garbage"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := Decode(body, want)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if s.App != want.App || s.Room != want.Room || s.WindowMs != want.WindowMs || s.Index != want.Index {
			t.Fatalf("accepted a foreign segment %v", s)
		}
		again, err := Decode(encode(t, s), want)
		if err != nil || !proto.Equal(again, s) {
			t.Fatalf("round trip: %v, %v", again, err)
		}
	})
}
