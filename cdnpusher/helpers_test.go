package cdnpusher

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/s3test"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is 300 ms into window t0Index of 1 s.
const (
	t0Index = 1_764_451_200
	t0      = t0Index*1000 + 300
	app     = "app1"
)

// closeWindow moves clock past the end (and grace) of window index and writes out what closed:
// the test does what the sealer's ticker would.
func closeWindow(clock *testkit.Clock, p *Pusher, index int64) {
	clock.Set(time.UnixMilli((index+1)*int64(p.windowMs) + p.cfg.Grace.Milliseconds()))
	p.seal(false)
}

// start runs a pusher on srv with cfg's storage fields and clock filled in, closed at the end of
// the test.
func start(t *testing.T, srv *s3test.Server, cfg Config) (*Pusher, *testkit.Clock) {
	t.Helper()
	clock := testkit.NewClock(time.UnixMilli(t0))
	cfg.Endpoint, cfg.Bucket = srv.Endpoint, s3test.Bucket
	cfg.AccessKey, cfg.SecretKey = s3test.AccessKey, s3test.SecretKey
	cfg.Now = clock.Now
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Registerer = prometheus.NewRegistry()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p, clock
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

// msg is a message of room in lane, stamped ms, with an id that sorts by seq.
func msg(room string, lane clientpb.Lane, ms int64, seq int) *clientpb.Message {
	return &clientpb.Message{
		Id: fmt.Sprintf("01KB%022d", seq), Room: room, Sender: "u1", Type: "danmaku",
		Lane: lane, Body: fmt.Appendf(nil, "m%d", seq), ServerTimeMs: ms,
	}
}

func add(t *testing.T, p *Pusher, msgs ...*clientpb.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := p.Add(app, m); err != nil {
			t.Fatal(err)
		}
	}
}

// fetch waits until the segment of room and index is on storage, checks the headers clients
// rely on and decodes it as a client would.
func fetch(t *testing.T, srv *s3test.Server, p *Pusher, room string, index int64) *clientpb.Segment {
	t.Helper()
	key := p.cfg.Prefix + segment.Key(app, room, p.windowMs, index)
	var s *clientpb.Segment
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		resp, body, err := srv.Get(key)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", key, resp.Status)
		}
		for h, want := range map[string]string{
			"Content-Type":     segment.ContentType,
			"Content-Encoding": segment.ContentEncoding,
			"Cache-Control":    segment.CacheControl,
		} {
			if got := resp.Header.Get(h); got != want {
				t.Fatalf("%s: %s = %q, want %q", key, h, got, want)
			}
		}
		s, err = segment.Decode(body, segment.Want{App: app, Room: room, WindowMs: p.windowMs, Index: index})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return nil
	})
	return s
}

// missing fails t if the segment of room and index is on storage.
func missing(t *testing.T, srv *s3test.Server, p *Pusher, room string, index int64) {
	t.Helper()
	key := p.cfg.Prefix + segment.Key(app, room, p.windowMs, index)
	resp, _, err := srv.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET %s: %s, want 404", key, resp.Status)
	}
}

func ids(msgs []*clientpb.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Id
	}
	return out
}

// seqOf is the seq msg gave m's id.
func seqOf(t *testing.T, m *clientpb.Message) int {
	t.Helper()
	n, err := strconv.Atoi(m.Id[4:])
	if err != nil {
		t.Fatalf("id %q: %v", m.Id, err)
	}
	return n
}

// waitCounter waits until c reaches want.
func waitCounter(t *testing.T, c prometheus.Counter, want float64) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := promtest.ToFloat64(c); got != want {
			return fmt.Errorf("%s is %v, want %v", c.Desc(), got, want)
		}
		return nil
	})
}
