package sdk_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/cdnpusher"
	"roomcast/internal/bus"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/s3test"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
	"roomcast/sdk"
)

// TestClusterCDNExpiry runs a room in CDN mode for longer than the segments' TTL, on real
// engines (NATS, the services, a ChatLink, a pusher writing to versitygw, an origin in front of
// it, an SDK client): 8 s of bulk messages with a TTL of 3 s. The segments older than the TTL
// leave the bucket while the room goes on (an old one answers 404 at the origin), the bucket
// holds no more than the TTL's worth, the newest ones are served, and the client goes on
// reading the room's messages from the segments written after the first deletions.
func TestClusterCDNExpiry(t *testing.T) {
	const (
		room     = "expiring"
		window   = 1000 // ms
		ttl      = 3 * time.Second
		run      = 8 * time.Second
		interval = 100 * time.Millisecond // between bulk messages
		// slack is how much longer than the TTL a segment may stay: the sweeps' interval and a
		// sweep's time on a loaded machine.
		slack = 2 * time.Second
	)
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks = 1
		cfg.NoPusher = true
		cfg.CDN.Tick = 50 * time.Millisecond
	})
	s3 := s3test.Start(t)
	nc, err := bus.Connect(c.NATSURL(), "test pusher", nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pusher, err := cdnpusher.StartService(cdnpusher.ServiceConfig{Bus: nc, ID: "p1", Pusher: cdnpusher.Config{
		Endpoint: s3.Endpoint, Bucket: s3test.Bucket, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey,
		SegmentTTL: ttl, Registerer: reg, // sweeps every eighth of the TTL
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pusher.Shutdown(ctx)
		nc.Close()
	})
	origin := startS3Origin(t, s3)
	ctx := context.Background()
	if err := apiJSON(ctx, c, "PUT", "/v1/cdn", vendorsBody(origin.URL), nil); err != nil {
		t.Fatal(err)
	}
	if err := apiJSON(ctx, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_BULK"}, nil); err != nil {
		t.Fatal(err)
	}
	rel := &released{}
	var cl *sdk.Client
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		cl = dialCluster(t, c, sdk.TransportTCP, "viewer", room, rel.config(sdk.Config{}))
		if m := cl.LoginAck().GetCdn().GetMode(); m != clientpb.CdnMode_CDN_MODE_BULK {
			cl.Close()
			return fmt.Errorf("LoginAck's CDN mode %v", m)
		}
		return nil
	})

	// stored lists the room's segments in the bucket.
	prefix := segment.Key(devcluster.App, room, window, 0)
	prefix = prefix[:len(prefix)-1]
	stored := func() ([]int64, error) {
		var out []int64
		for obj := range s3.Client().ListObjectsIter(ctx, s3test.Bucket, minio.ListObjectsOptions{Prefix: prefix}) {
			if obj.Err != nil {
				return nil, obj.Err
			}
			i, err := strconv.ParseInt(strings.TrimPrefix(obj.Key, prefix), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("key %s: %v", obj.Key, err)
			}
			out = append(out, i)
		}
		slices.Sort(out)
		return out, nil
	}
	// fresh fails unless every stored segment's window ended at most the TTL and the slack ago.
	fresh := func() ([]int64, error) {
		idx, err := stored()
		if err != nil {
			return nil, err
		}
		if len(idx) == 0 {
			return nil, fmt.Errorf("no segment stored")
		}
		if age := time.Since(time.UnixMilli((idx[0] + 1) * window)); age > ttl+slack {
			return idx, fmt.Errorf("segment %d stored %v after its window ended", idx[0], age.Round(time.Millisecond))
		}
		return idx, nil
	}

	// Bulk messages every interval for the run, keeping their ids and when they were sent.
	var (
		mu   sync.Mutex // guards sent
		sent = map[string]time.Time{}
		stop = make(chan struct{})
		done = make(chan error, 1)
	)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			var out struct {
				ID string `json:"id"`
			}
			if err := apiJSON(ctx, c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"lane": "bulk", "body": fmt.Sprint("danmaku ", i)}, &out); err != nil {
				done <- err
				return
			}
			mu.Lock()
			sent[out.ID] = time.Now()
			mu.Unlock()
		}
	}()
	start := time.Now()
	var first int64 // the oldest segment seen
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		idx, err := stored()
		if err != nil || len(idx) == 0 {
			return fmt.Errorf("no segment stored yet (%v)", err)
		}
		first = idx[0]
		return nil
	})
	// The first deletions: the oldest segment goes once its TTL has passed.
	var deletedAt time.Time
	var hitsBefore uint64
	testkit.CheckFor(t, ttl+slack+10*time.Second, 50*time.Millisecond, func() error {
		if gathered(t, reg, "roomcast_cdnpusher_segments_deleted_total") == 0 {
			return fmt.Errorf("no segment deleted")
		}
		if idx, err := stored(); err != nil || len(idx) > 0 && idx[0] <= first {
			return fmt.Errorf("segment %d still stored (%v)", first, err)
		}
		deletedAt, hitsBefore = time.Now(), cl.CDNStats().Hits
		return nil
	})
	t.Logf("first deletion seen %v after the start", deletedAt.Sub(start).Round(time.Millisecond))
	time.Sleep(max(0, run-time.Since(start))) // the room runs on: the test's length, not a wait for an event
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Old segments are gone, no more than the TTL's worth (and the slack's) stays, and the
	// newest is served; an expired one answers 404.
	var idx []int64
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		var err error
		idx, err = fresh()
		return err
	})
	if most := int((ttl + slack) / (window * time.Millisecond)); len(idx) > most+2 {
		t.Errorf("%d segments stored (%d-%d), want at most %d", len(idx), idx[0], idx[len(idx)-1], most+2)
	}
	get := func(index int64) int {
		resp, err := http.Get(segment.URL(origin.URL+"/{app}/{room}/{window_ms}/{index}", devcluster.App, room, window, index))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(idx[len(idx)-1]); code != http.StatusOK {
		t.Errorf("the newest segment, %d: HTTP %d", idx[len(idx)-1], code)
	}
	if code := get(first); code != http.StatusNotFound {
		t.Errorf("the expired segment %d: HTTP %d, want 404", first, code)
	}

	// The client reads on: it gets the messages sent after the first deletions, from segments
	// written meanwhile; a window it counted as a gap (a poll slower than the TTL on a loaded
	// machine) may be missing, nothing else.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		got, _ := rel.order(t)
		st := cl.CDNStats()
		mu.Lock()
		defer mu.Unlock()
		var missing, after int
		for id, at := range sent {
			if at.Before(deletedAt) {
				continue
			}
			after++
			if _, ok := got[id]; !ok {
				missing++
			}
		}
		switch {
		case after == 0:
			return fmt.Errorf("no message sent after the first deletion")
		case missing > 2*int(st.Gaps)*int(window*time.Millisecond/interval):
			return fmt.Errorf("%d of the %d messages sent after the first deletion not handed on (%+v)", missing, after, st)
		case st.Hits < hitsBefore+3:
			return fmt.Errorf("%d segments read since the first deletion (%+v)", st.Hits-hitsBefore, st)
		}
		return nil
	})
	written := gathered(t, reg, "roomcast_cdnpusher_segments_written_total")
	empty := gathered(t, reg, "roomcast_cdnpusher_empty_segments_written_total")
	t.Logf("%v written (%v empty), %v bytes (%.0f a segment), %v deleted; stored at the end: %d (%d-%d); client: %+v",
		written, empty, gathered(t, reg, "roomcast_cdnpusher_segment_bytes_total"),
		gathered(t, reg, "roomcast_cdnpusher_segment_bytes_total")/written,
		gathered(t, reg, "roomcast_cdnpusher_segments_deleted_total"), len(idx), idx[0], idx[len(idx)-1], cl.CDNStats())
}
