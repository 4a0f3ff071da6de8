package cdnpusher

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"roomcast/internal/testkit/s3test"
	"roomcast/proto/segment"
)

// stopSweeper stops p's own sweeps: the test sweeps when its clock says so.
func stopSweeper(p *Pusher) {
	p.stopSweep()
	p.sweeps.Wait()
}

// present reports whether key is in the bucket.
func present(t *testing.T, srv *s3test.Server, key string) bool {
	t.Helper()
	resp, _, err := srv.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusNotFound:
		return false
	}
	t.Fatalf("GET %s: %s", key, resp.Status)
	return false
}

// A sweep deletes the segments whose window ended more than SegmentTTL ago, under the prefix
// and in every window folder, and nothing else: not the live segments, not objects that are not
// laid out as segments, not what lies outside the prefix. With storage down it counts the
// failure and deletes nothing, while segments are still written once storage is back; the next
// sweep deletes what the failed one left. A pusher started later (a restart) sweeps what an
// earlier one wrote: the sweep reads the bucket, not memory.
func TestSegmentsExpire(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	const ttl = 3 * time.Second
	cfg := Config{Prefix: "rc/", SegmentTTL: ttl, RetryMax: 200 * time.Millisecond}
	p, clock := start(t, srv, cfg)
	stopSweeper(p)
	if err := p.Open(app, "lobby"); err != nil {
		t.Fatal(err)
	}
	for i := int64(t0Index); i <= t0Index+5; i++ {
		closeWindow(clock, p, i)
		fetch(t, srv, p, "lobby", i)
	}
	key := func(index int64) string { return "rc/" + segment.Key(app, "lobby", 1000, index) }
	// Objects the sweep must leave alone, and one old segment of another window length that it
	// must delete.
	keep := []string{"rc/notes.txt", "rc/app1/lobby/1000/readme", "rc/app1/lobby/abc/5", "rc/app1/lob.by/1000/5", "other/app1/lobby/1000/5"}
	oldWindow := "rc/" + segment.Key(app, "lobby", 500, 2*t0Index)
	for _, k := range append(keep, oldWindow) {
		if _, err := srv.Client().PutObject(context.Background(), s3test.Bucket, k, bytes.NewReader([]byte("x")), 1, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Windows up to t0Index+2 ended 3 s ago or more: expired. The window of 500 ms whose
	// index is 2*t0Index ended at (t0Index+0.5) s.
	clock.Set(time.UnixMilli((t0Index + 3) * 1000).Add(ttl))
	res := p.sweeper.sweep(context.Background())
	if res.deleted != 4 || res.listErrs != 0 || res.deleteErrs != 0 {
		t.Fatalf("sweep: %+v, want 4 deleted and no error", res)
	}
	for i := int64(t0Index); i <= t0Index+5; i++ {
		if got, want := present(t, srv, key(i)), i >= t0Index+3; got != want {
			t.Errorf("segment %d present: %v, want %v", i, got, want)
		}
	}
	for _, k := range keep {
		if !present(t, srv, k) {
			t.Errorf("%s deleted: it is no segment under the prefix", k)
		}
	}
	if present(t, srv, oldWindow) {
		t.Errorf("%s kept: it expired", oldWindow)
	}
	if got := promtest.ToFloat64(p.metrics.deleted); got != 4 {
		t.Errorf("deleted metric %v, want 4", got)
	}

	// Storage down: the sweep fails and says so; a window closing meanwhile is written once
	// storage is back.
	srv.Stop()
	clock.Set(time.UnixMilli((t0Index + 5) * 1000).Add(ttl))
	if res := p.sweeper.sweep(context.Background()); res.listErrs == 0 || res.deleted != 0 {
		t.Fatalf("sweep with storage down: %+v, want a list error and nothing deleted", res)
	}
	if got := promtest.ToFloat64(p.metrics.deleteErrs[deleteErrList]); got == 0 {
		t.Error("no list error counted")
	}
	closeWindow(clock, p, t0Index+6)
	srv.Restart()
	fetch(t, srv, p, "lobby", t0Index+6)

	// A pusher started later, with its own clock, deletes what the first one wrote.
	p2, clock2 := start(t, srv, cfg)
	stopSweeper(p2)
	clock2.Set(time.UnixMilli((t0Index + 5) * 1000).Add(ttl))
	if res := p2.sweeper.sweep(context.Background()); res.deleted != 2 || res.listErrs+res.deleteErrs != 0 {
		t.Fatalf("sweep after the outage, by a new pusher: %+v, want 2 deleted", res)
	}
	for i := int64(t0Index + 3); i <= t0Index+6; i++ {
		if got, want := present(t, srv, key(i)), i >= t0Index+5; got != want {
			t.Errorf("segment %d present: %v, want %v", i, got, want)
		}
	}
}

// A negative SegmentTTL keeps segments forever: no sweeper runs.
func TestSegmentTTLNegativeKeeps(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Endpoint: "127.0.0.1:1", Bucket: "b", SegmentTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	if p.sweeper != nil {
		t.Fatal("a sweeper runs with a negative SegmentTTL")
	}
	d, err := Config{Endpoint: "e", Bucket: "b"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d.SegmentTTL != DefaultSegmentTTL || d.SweepInterval != time.Hour {
		t.Fatalf("defaults: SegmentTTL %v, SweepInterval %v; want %v and 1h", d.SegmentTTL, d.SweepInterval, DefaultSegmentTTL)
	}
}
