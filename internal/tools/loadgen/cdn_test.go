package loadgen_test

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/tools/loadgen"
)

// bench cdn against a dev cluster (its pusher and origin) through the bench's own nginx: every
// viewer gets every window's segment, about once a window, and the edge lets one or two
// requests a segment through to the origin.
func TestCDN(t *testing.T) {
	c := startCluster(t)
	cfg := config(c, 2000)
	cfg.Rate, cfg.Duration, cfg.Conns = 500, 4*time.Second, 16
	res, err := loadgen.RunCDN(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if !res.OK() || res.Windows < 2 || res.Hits != int64(res.Viewers*res.Windows) {
		t.Errorf("cdn on a healthy cluster: %+v", res)
	}
	if res.OriginRequests < int64(res.Windows) || res.OriginMaxPerSegment > 2 {
		t.Errorf("%d origin requests for %d windows, at most %d a segment", res.OriginRequests, res.Windows, res.OriginMaxPerSegment)
	}
	// About once a window while the pusher is on time. A segment the pusher writes late (a
	// loaded machine) is polled again every fifth of a window until it is there: those polls
	// are the lateness's, at most one per retry period of it.
	retry := float64(res.WindowMS) / 5
	allowed := 1.2
	if res.PollLateP99MS > retry {
		allowed += res.PollLateP99MS / retry
	}
	if res.PollsPerViewerPerWindow < 1 || res.PollsPerViewerPerWindow > allowed {
		t.Errorf("%.3f polls per viewer per window, over %.2f (segments in viewers' hands %.0f ms late at p99)", res.PollsPerViewerPerWindow, allowed, res.PollLateP99MS)
	}
	if res.PusherMessagesPerSec < 400 || res.SegmentsWritten < float64(res.Windows) {
		t.Errorf("pusher: %.0f messages/s, %.0f segments", res.PusherMessagesPerSec, res.SegmentsWritten)
	}
	if res.BytesPerViewerPerSec <= 0 || res.LongLinkBytesPerViewerPerSec <= 0 || res.SegmentMessages <= 0 {
		t.Errorf("bytes: %+v", res)
	}
	m := jsonFields(t, res)
	requireFields(t, m, "scenario", "viewers", "polls_per_viewer_per_window", "origin_requests_per_segment",
		"bytes_per_viewer_per_sec", "long_link_bytes_per_viewer_per_sec", "pusher_messages_per_sec")
}
