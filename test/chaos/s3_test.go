package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/procs"
	"roomcast/internal/testkit/s3test"
)

// metric sums the samples of a metric, over its labels, that the role's /metrics serves.
func metric(role *procs.Role, name string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + role.Ops + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", role.Name, line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("%s serves no %s", role.Name, name)
	}
	return sum, sc.Err()
}

// segments lists the indexes of the room's segments in the bucket, in order.
func segments(t *testing.T, d *procs.Deployment, room string) []int64 {
	t.Helper()
	var out []int64
	prefix := "roomcast/" + procs.App + "/" + room + "/" // deploy/roomcast.yaml's s3-prefix
	for obj := range d.S3.Client().ListObjects(context.Background(), s3test.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		i, err := strconv.ParseInt(obj.Key[strings.LastIndexByte(obj.Key, '/')+1:], 10, 64)
		if err != nil {
			t.Fatalf("segment key %q: %v", obj.Key, err)
		}
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// TestStopS3: S3 is killed for 20 s while a 200-member room gets 10 critical messages a second
// and, in CDN mode, 50 bulk ones. The long connections do not notice (no member reconnects;
// every critical message arrives once, in order); the pusher retries and, S3 back, writes every
// window's segment (none missing between the first and the last, no gap counted) or counts
// what it could not; its memory stays bounded.
func TestStopS3(t *testing.T) {
	d := start(t, procs.Config{})
	const n, critRate, bulkRate = 200, 10, 50
	const outage = 20 * time.Second
	r := join(t, d, "stage", n)
	pusher := d.Pushers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := apiCall(ctx, r.hc, d.Services[0].API, "PUT", "/v1/rooms/stage/cdn", `{"mode":"CDN_MODE_BULK"}`); err != nil {
		t.Fatal(err)
	}
	// Bulk messages all along, until the end of the test.
	bulkCtx, stopBulk := context.WithCancel(ctx)
	bulkDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second / bulkRate)
		defer tick.Stop()
		for {
			select {
			case <-bulkCtx.Done():
				bulkDone <- nil
				return
			case <-tick.C:
			}
			if err := apiCall(bulkCtx, r.hc, d.Services[0].API, "POST", "/v1/rooms/stage/messages", `{"type":"danmaku","lane":"bulk","body":"b"}`); err != nil && bulkCtx.Err() == nil {
				bulkDone <- err
				return
			}
		}
	}()
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if len(segments(t, d, "stage")) < 2 {
			return fmt.Errorf("the pusher wrote no segments of the room yet")
		}
		return nil
	})
	rssBefore, err := metric(pusher, "process_resident_memory_bytes")
	if err != nil {
		t.Fatal(err)
	}
	rssMax := rssBefore
	total := critRate * int(outage/time.Second+10)
	var restartedAt time.Time
	var caughtUp time.Duration // from S3's restart until the pusher's queue is empty
	err = r.send(ctx, total, critRate, func(i int) {
		switch i {
		case 5 * critRate:
			d.S3.Stop()
		case 5*critRate + int(outage/time.Second)*critRate:
			d.S3.Restart()
			restartedAt = time.Now()
		}
		if rss, err := metric(pusher, "process_resident_memory_bytes"); err == nil {
			rssMax = max(rssMax, rss)
		}
		if !restartedAt.IsZero() && caughtUp == 0 {
			if q, err := metric(pusher, "roomcast_cdnpusher_queued_segments"); err == nil && q == 0 {
				caughtUp = time.Since(restartedAt)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	tl := r.await(t, total, 10*time.Second)
	tl.check(t)
	reconnects := 0
	for _, m := range r.members {
		m.mu.Lock()
		if !m.reconnected.IsZero() {
			reconnects++
		}
		m.mu.Unlock()
	}
	if reconnects > 0 {
		t.Errorf("%d members reconnected during the S3 outage", reconnects)
	}
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		q, err := metric(pusher, "roomcast_cdnpusher_queued_segments")
		if err != nil || q > 0 {
			return fmt.Errorf("%v segments queued (%v)", q, err)
		}
		if caughtUp == 0 {
			caughtUp = time.Since(restartedAt)
		}
		return nil
	})
	stopBulk()
	if err := <-bulkDone; err != nil {
		t.Fatal(err)
	}
	segs := segments(t, d, "stage")
	missing := int(segs[len(segs)-1]-segs[0]+1) - len(segs)
	gaps, _ := metric(pusher, "roomcast_cdnpusher_gaps_total")
	failures, _ := metric(pusher, "roomcast_cdnpusher_write_failures_total")
	if float64(missing) > gaps {
		t.Errorf("%d windows between the first segment and the last are missing, %v counted as gaps", missing, gaps)
	}
	if failures == 0 {
		t.Errorf("no write failed while S3 was down %v: the outage did not happen", outage)
	}
	const bound = 64 << 20
	if rssMax-rssBefore > bound {
		t.Errorf("the pusher grew from %d MB to %d MB during the outage", int(rssBefore)>>20, int(rssMax)>>20)
	}
	record(t, fmt.Sprintf("S3 killed for %v; %d members, %d critical msgs at %d/s, bulk at %d/s in CDN mode: members reconnected %d; critical lost %d, duplicated %d, in another order than the room's %d, room order departing from send order %d; pusher write failures %v, queue empty %v after S3 was back, segments %d, missing %d, gaps counted %v; pusher RSS %d MB before, %d MB at most",
		outage, n, total, critRate, bulkRate, reconnects, tl.lost, tl.duplicates, tl.disordered, tl.swapped, failures, caughtUp.Round(10*time.Millisecond), len(segs), missing, gaps, int(rssBefore)>>20, int(rssMax)>>20))
}
