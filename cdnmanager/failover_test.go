package cdnmanager_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/cdnpusher"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/s3test"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// sender sends a bulk message (and, with critical, a critical one) to a room every interval
// until stop, keeping the bulk messages' ids and times.
type sender struct {
	mu       sync.Mutex // guards bulk and critical
	bulk     map[string]int64
	critical int // critical messages sent
	stop     chan struct{}
	done     sync.WaitGroup
}

func startSender(t *testing.T, c *devcluster.Cluster, room string, interval time.Duration, critical bool) *sender {
	s := &sender{bulk: map[string]int64{}, stop: make(chan struct{})}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-time.After(interval):
			}
			var out sent
			if err := apiCall(c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"lane": "bulk", "body": fmt.Sprint("bulk ", i)}, &out); err != nil {
				t.Error(err)
				return
			}
			s.mu.Lock()
			s.bulk[out.ID] = out.ServerTimeMs
			s.mu.Unlock()
			if critical {
				if err := apiCall(c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"lane": "critical", "body": fmt.Sprint("critical ", i)}, nil); err != nil {
					t.Error(err)
					return
				}
				s.mu.Lock()
				s.critical++
				s.mu.Unlock()
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

func (s *sender) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.done.Wait()
}

// sentIn returns the bulk messages stamped in windows [from, to] of 1 s.
func (s *sender) sentIn(from, to int64) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, ms := range s.bulk {
		if i := segment.Index(ms, 1000); i >= from && i <= to {
			ids = append(ids, id)
		}
	}
	return ids
}

// stored returns a segment as versitygw holds it, or nil while it is missing.
func stored(t *testing.T, s3 *s3test.Server, room string, index int64) *clientpb.Segment {
	t.Helper()
	resp, body, err := s3.Get(segment.Key(devcluster.App, room, 1000, index))
	if err != nil || resp.StatusCode != 200 {
		return nil
	}
	s, err := segment.Decode(body, segment.Want{App: devcluster.App, Room: room, WindowMs: 1000, Index: index})
	if err != nil {
		t.Fatalf("segment %d: %v", index, err)
	}
	return s
}

func nowIndex() int64 { return segment.Index(time.Now().UnixMilli(), 1000) }

// Kill the pusher that owns a room while a second one runs: within 5 s the room is the other
// pusher's and its segments resume; the windows in between are never written, missing indexes
// a client skips (docs/cdn.md), and the manager counts the change as a lost pusher.
func TestPusherLostRoomMoves(t *testing.T) {
	t.Parallel()
	c := startCluster(t, func(cfg *devcluster.Config) { cfg.NoPusher = true })
	s3 := s3test.Start(t)
	storage := cdnpusher.Config{Endpoint: s3.Endpoint, Bucket: s3test.Bucket, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey}
	kills := map[string]func(){
		"p1": startPusher(t, c, storage, "p1", nil),
		"p2": startPusher(t, c, storage, "p2", nil),
	}
	const room = "show"
	api(t, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_BULK"}, nil)
	owner := waitMode(t, c, room, "CDN_MODE_BULK").Pusher
	snd := startSender(t, c, room, 50*time.Millisecond, false)
	start := nowIndex()
	waitFor(t, 5*time.Second, func() bool { return stored(t, s3, room, start+1) != nil })

	killedAt := time.Now()
	kills[owner]()
	killed := segment.Index(killedAt.UnixMilli(), 1000)
	var moved time.Duration
	var resumed int64
	for resumed == 0 && time.Since(killedAt) < 5*time.Second {
		if moved == 0 && getRoomCdn(t, c, room).Pusher != owner {
			moved = time.Since(killedAt)
		}
		for i := killed + 1; i < nowIndex(); i++ {
			if stored(t, s3, room, i) != nil {
				resumed = i
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if moved == 0 || resumed == 0 {
		t.Fatalf("5 s after the kill: moved after %v, segments resumed at index %d (killed in %d)", moved, resumed, killed)
	}
	t.Logf("room moved %v after the kill; segments resume at index %d, %v after the kill", moved, resumed, time.Since(killedAt))
	if got := metric(t, c, `roomcast_cdnmanager_assignment_changes_total{reason="lost"}`); got != 1 {
		t.Errorf("lost assignment changes: %v, want 1", got)
	}

	// From the resumed index on, every window has its segment and every bulk message is in one.
	waitFor(t, 5*time.Second, func() bool { return stored(t, s3, room, resumed+2) != nil })
	snd.halt()
	var gaps []int64
	inSegments := map[string]bool{}
	for i := start + 1; i <= resumed+2; i++ {
		s := stored(t, s3, room, i)
		if s == nil {
			gaps = append(gaps, i)
			continue
		}
		for _, m := range s.Messages {
			inSegments[m.Id] = true
		}
	}
	if len(gaps) == 0 || slices.ContainsFunc(gaps, func(i int64) bool { return i >= resumed }) {
		t.Errorf("missing indexes %v: want some, all before %d", gaps, resumed)
	}
	for _, id := range snd.sentIn(resumed, resumed+1) {
		if !inSegments[id] {
			t.Errorf("bulk %s sent after the move in no segment", id)
		}
	}
}

// Object storage down for 10 s (3 s with -short): the long connection delivers critical
// messages as fast as before, the pusher retries and, once storage is back, catches up: every
// window's segment is written and holds its bulk messages.
// Not parallel: it compares critical latency before and during the outage, which other
// tests' load would blur.
func TestStorageOutage(t *testing.T) {
	outage := 10 * time.Second
	if testing.Short() {
		outage = 3 * time.Second
	}
	c := startCluster(t, func(cfg *devcluster.Config) { cfg.NoPusher = true })
	s3 := s3test.Start(t)
	reg := prometheus.NewRegistry()
	startPusher(t, c, cdnpusher.Config{Endpoint: s3.Endpoint, Bucket: s3test.Bucket, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey}, "p1", reg)
	const room = "storm"
	api(t, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_BULK"}, nil)
	waitMode(t, c, room, "CDN_MODE_BULK")
	m := join(t, c, "viewer", room)

	// Critical messages' delay from their server time to the member, before and during the
	// outage.
	var mu sync.Mutex
	var phase int // 0 before, 1 during
	delays := [2][]time.Duration{}
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for f := range m.frames {
			for _, msg := range f.GetPush().GetMessages() {
				if msg.Lane == clientpb.Lane_LANE_BULK {
					t.Errorf("bulk %s pushed in CDN mode", msg.Id)
				}
				mu.Lock()
				delays[phase] = append(delays[phase], time.Since(time.UnixMilli(msg.ServerTimeMs)))
				mu.Unlock()
			}
		}
	}()
	snd := startSender(t, c, room, 50*time.Millisecond, true)
	first := nowIndex() + 1
	time.Sleep(3 * time.Second)

	mu.Lock()
	phase = 1
	mu.Unlock()
	s3.Stop()
	time.Sleep(outage)
	s3.Restart()
	mu.Lock()
	during := slices.Clone(delays[1])
	before := slices.Clone(delays[0])
	mu.Unlock()
	last := nowIndex() - 1

	p99 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)*99/100]
	}
	if len(before) < 5 || len(during) < 5 {
		t.Fatalf("critical messages delivered: %d before, %d during the outage", len(before), len(during))
	}
	t.Logf("critical p99: %v before, %v during the outage (%d, %d messages)", p99(before), p99(during), len(before), len(during))
	if p99(during) > p99(before)*6/5+50*time.Millisecond {
		t.Errorf("critical p99 during the outage %v, before %v", p99(during), p99(before))
	}

	// Catching up: every window from before the outage to its end gets its segment.
	inSegments := map[string]bool{}
	for i := first; i <= last; i++ {
		var s *clientpb.Segment
		deadline := time.Now().Add(20 * time.Second)
		for s = stored(t, s3, room, i); s == nil && time.Now().Before(deadline); s = stored(t, s3, room, i) {
			time.Sleep(50 * time.Millisecond)
		}
		if s == nil {
			t.Fatalf("segment %d missing after the outage (gaps counted: %v)", i,
				gathered(t, reg, "roomcast_cdnpusher_gaps_total"))
		}
		for _, msg := range s.Messages {
			inSegments[msg.Id] = true
		}
	}
	snd.halt()
	// Every critical message sent came over the long connection.
	waitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		snd.mu.Lock()
		defer snd.mu.Unlock()
		return len(delays[0])+len(delays[1]) == snd.critical
	})
	for _, id := range snd.sentIn(first, last-1) {
		if !inSegments[id] {
			t.Errorf("bulk %s in no segment", id)
		}
	}
	if retries := gathered(t, reg, "roomcast_cdnpusher_write_retries_total"); retries == 0 {
		t.Error("no write retried during the outage")
	}
	m.conn.Close()
	readers.Wait()
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
