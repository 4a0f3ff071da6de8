package cdnpusher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/s3test"
	"roomcast/proto/clientpb"
)

// A window's messages land, ordered, as one segment at {prefix}{app}/{room}/{window_ms}/{index}
// with the headers clients rely on; another room's go to its own key; nothing is written
// before the window closes.
func TestSegmentsLandOrdered(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{Prefix: "live/"})

	var sent []*clientpb.Message
	for i := range 60 {
		lane := []clientpb.Lane{clientpb.Lane_LANE_BULK, clientpb.Lane_LANE_NORMAL, clientpb.Lane_LANE_CRITICAL, clientpb.Lane_LANE_UNSPECIFIED}[i%4]
		// Times repeat so that ids decide between equal times.
		sent = append(sent, msg("r1", lane, t0Index*1000+int64(i%7)*100, i))
	}
	shuffled := slices.Clone(sent)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	add(t, p, shuffled...)
	add(t, p, msg("r2", clientpb.Lane_LANE_BULK, t0+1, 1000))

	p.seal(false)
	missing(t, srv, p, "r1", t0Index)

	closeWindow(clock, p, t0Index)
	s := fetch(t, srv, p, "r1", t0Index)
	// The expected order, built another way: stable sorts from the last key to the first.
	want := slices.Clone(sent)
	slices.SortStableFunc(want, func(a, b *clientpb.Message) int { return strings.Compare(a.Id, b.Id) })
	slices.SortStableFunc(want, func(a, b *clientpb.Message) int { return int(a.ServerTimeMs - b.ServerTimeMs) })
	rank := map[clientpb.Lane]int{clientpb.Lane_LANE_CRITICAL: 0, clientpb.Lane_LANE_NORMAL: 1, clientpb.Lane_LANE_UNSPECIFIED: 1, clientpb.Lane_LANE_BULK: 2}
	slices.SortStableFunc(want, func(a, b *clientpb.Message) int { return rank[a.Lane] - rank[b.Lane] })
	if !slices.Equal(ids(s.Messages), ids(want)) {
		t.Fatalf("order:\n got %v\nwant %v", ids(s.Messages), ids(want))
	}
	if classOf(s.Messages[0].Lane) != classCritical || classOf(s.Messages[len(s.Messages)-1].Lane) != classBulk {
		t.Fatalf("lanes out of priority order: first %v, last %v", s.Messages[0].Lane, s.Messages[len(s.Messages)-1].Lane)
	}
	if !proto.Equal(s.Messages[0], want[0]) {
		t.Fatalf("message changed on the way: %v, want %v", s.Messages[0], want[0])
	}
	if s.Sampled != 0 || s.NextAtMs != (t0Index+2)*1000+100 {
		t.Fatalf("sampled %d, next_at_ms %d", s.Sampled, s.NextAtMs)
	}
	if r2 := fetch(t, srv, p, "r2", t0Index); len(r2.Messages) != 1 || r2.Messages[0].Room != "r2" {
		t.Fatalf("r2: %v", r2.Messages)
	}
	if got := promtest.ToFloat64(p.metrics.messages); got != 61 {
		t.Fatalf("messages metric %v, want 61", got)
	}
}

// Over the cap a window keeps every higher-lane message first and a uniform sample of the
// lane that does not fit, never its first messages only, and counts the rest.
func TestCapSamples(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{})

	seq := 0
	next := func(lane clientpb.Lane) *clientpb.Message {
		seq++
		return msg("big", lane, t0+int64(seq%600), seq)
	}
	for range 1000 {
		add(t, p, next(clientpb.Lane_LANE_BULK))
	}
	for range 50 {
		add(t, p, next(clientpb.Lane_LANE_CRITICAL))
	}
	for range 100 {
		add(t, p, next(clientpb.Lane_LANE_NORMAL))
	}
	closeWindow(clock, p, t0Index)
	s := fetch(t, srv, p, "big", t0Index)

	var lanes [numClasses]int
	lastBulk := 0
	for _, m := range s.Messages {
		lanes[classOf(m.Lane)]++
		if m.Lane == clientpb.Lane_LANE_BULK {
			lastBulk = max(lastBulk, seqOf(t, m))
		}
	}
	if len(s.Messages) != 200 || lanes != [numClasses]int{50, 100, 50} {
		t.Fatalf("kept %d messages by class %v, want 200 as [50 100 50]", len(s.Messages), lanes)
	}
	if s.Sampled != 950 {
		t.Fatalf("sampled %d, want 950", s.Sampled)
	}
	// Truncation would keep bulk messages 1..50; a uniform sample of 50 out of 1000 keeps none
	// past 500 with probability 2^-50.
	if lastBulk <= 500 {
		t.Fatalf("bulk kept only from the start of the window (last seq %d): truncated, not sampled", lastBulk)
	}
	if got := promtest.ToFloat64(p.metrics.sampled); got != 950 {
		t.Fatalf("sampled metric %v, want 950", got)
	}
}

// A message that reaches the pusher after its window was written goes into the next window,
// keeping its own server time, and is counted late.
func TestLateMessageGoesToNextWindow(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{})

	first := msg("r1", clientpb.Lane_LANE_BULK, t0, 1)
	add(t, p, first)
	closeWindow(clock, p, t0Index)
	late := msg("r1", clientpb.Lane_LANE_BULK, t0+500, 2) // stamped in t0Index, which is written
	next := msg("r1", clientpb.Lane_LANE_BULK, (t0Index+1)*1000+10, 3)
	add(t, p, late, next)
	closeWindow(clock, p, t0Index+1)

	if s := fetch(t, srv, p, "r1", t0Index); !slices.Equal(ids(s.Messages), []string{first.Id}) {
		t.Fatalf("window %d: %v", t0Index, ids(s.Messages))
	}
	s := fetch(t, srv, p, "r1", t0Index+1)
	if !slices.Equal(ids(s.Messages), []string{late.Id, next.Id}) || s.Messages[0].ServerTimeMs != late.ServerTimeMs {
		t.Fatalf("window %d: %v", t0Index+1, s.Messages)
	}
	if got := promtest.ToFloat64(p.metrics.late); got != 1 {
		t.Fatalf("late metric %v, want 1", got)
	}
}

// A quiet window of an active room gets an empty segment, so pollers never wait on a 404; a
// room idle for Config.Idle stops getting them.
func TestEmptyWindows(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{Idle: 3 * time.Second})

	if err := p.Open(app, "quiet"); err != nil {
		t.Fatal(err)
	}
	add(t, p, msg("chatty", clientpb.Lane_LANE_BULK, t0, 1))
	for i := range int64(3) {
		closeWindow(clock, p, t0Index+i)
	}
	for i := range int64(3) {
		if s := fetch(t, srv, p, "quiet", t0Index+i); len(s.Messages) != 0 || s.Sampled != 0 {
			t.Fatalf("quiet window %d: %v", i, s)
		}
	}
	if s := fetch(t, srv, p, "chatty", t0Index+2); len(s.Messages) != 0 {
		t.Fatalf("chatty after its message: %v", s)
	}
	// Idle: 3 windows after the last active one, then nothing.
	for i := int64(3); i < 6; i++ {
		closeWindow(clock, p, t0Index+i)
	}
	fetch(t, srv, p, "quiet", t0Index+3)
	// Both rooms' windows up to t0Index+3 are written: quiet's 4, chatty's 3 after its message.
	waitCounter(t, p.metrics.emptySegs, 4+3)
	missing(t, srv, p, "quiet", t0Index+4)
	missing(t, srv, p, "chatty", t0Index+4)
	if n := p.rooms.Load(); n != 0 {
		t.Fatalf("%d rooms still active", n)
	}
}

// Close writes out the windows still open, and Add fails afterwards.
func TestCloseWritesOpenWindows(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, _ := start(t, srv, Config{})
	m := msg("r1", clientpb.Lane_LANE_BULK, t0, 1)
	add(t, p, m)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(app, m); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v", err)
	}
	if s := fetch(t, srv, p, "r1", t0Index); len(s.Messages) != 1 {
		t.Fatalf("segment: %v", s)
	}
}

// Add refuses what must not (or cannot) be published, without taking it.
func TestAddRefuses(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, _ := start(t, srv, Config{})
	targeted := msg("r1", clientpb.Lane_LANE_BULK, t0, 1)
	targeted.TagExpr = "class == 'a'"
	badType := msg("r1", clientpb.Lane_LANE_BULK, t0, 2)
	badType.Type = "\xff"
	for name, tc := range map[string]struct {
		app  string
		m    *clientpb.Message
		want error
	}{
		"targeted": {app, targeted, ErrTargeted},
		"nil":      {app, nil, ErrInvalid},
		"bad room": {app, msg("a/b", clientpb.Lane_LANE_BULK, t0, 3), ErrInvalid},
		"bad app":  {"", msg("r1", clientpb.Lane_LANE_BULK, t0, 4), ErrInvalid},
		"no id":    {app, &clientpb.Message{Room: "r1"}, ErrInvalid},
		"not utf8": {app, badType, ErrInvalid},
	} {
		if err := p.Add(tc.app, tc.m); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if got := promtest.ToFloat64(p.metrics.messages); got != 0 {
		t.Fatalf("messages metric %v after refusals", got)
	}
	// Nothing refused goes uncounted.
	for reason, want := range map[string]float64{refusedTargeted: 1, refusedInvalid: 5, refusedReleased: 0, refusedClosed: 0} {
		if got := promtest.ToFloat64(p.metrics.refused[reason]); got != want {
			t.Errorf("refused{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// With storage down, windows keep closing: at most Queue segments wait (the oldest are dropped
// and counted as gaps), writers retry, and once storage is back the waiting segments land.
func TestStorageOutage(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	const queueLen, writers = 8, 2
	p, clock := start(t, srv, Config{Queue: queueLen, Writers: writers, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond})

	add(t, p, msg("r1", clientpb.Lane_LANE_BULK, t0, 0))
	closeWindow(clock, p, t0Index)
	fetch(t, srv, p, "r1", t0Index)

	srv.Stop()
	const outage = 40
	for i := int64(1); i <= outage; i++ {
		add(t, p, msg("r1", clientpb.Lane_LANE_BULK, (t0Index+i)*1000+1, int(i)))
		closeWindow(clock, p, t0Index+i)
		if n := p.queue.len(); n > queueLen {
			t.Fatalf("%d segments queued, cap %d", n, queueLen)
		}
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if promtest.ToFloat64(p.metrics.retries) == 0 {
			return errors.New("no retries yet")
		}
		return nil
	})
	gaps := promtest.ToFloat64(p.metrics.gaps[gapQueueFull])
	// Of the outage's segments, the queue holds queueLen and each writer one it retries.
	if gaps < outage-queueLen-writers || gaps > outage-queueLen {
		t.Fatalf("%v gaps, want %d..%d", gaps, outage-queueLen-writers, outage-queueLen)
	}

	srv.Restart()
	// The newest windows were queued and land; the oldest of the outage were dropped.
	for i := int64(outage - queueLen + 1); i <= outage; i++ {
		if s := fetch(t, srv, p, "r1", t0Index+i); len(s.Messages) != 1 || s.Messages[0].ServerTimeMs != (t0Index+i)*1000+1 {
			t.Fatalf("window %d: %v", i, s.Messages)
		}
	}
	missing(t, srv, p, "r1", t0Index+outage-queueLen)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if written := promtest.ToFloat64(p.metrics.segments); written+gaps != outage+1 {
			return fmt.Errorf("%v written + %v gaps, want %d", written, gaps, outage+1)
		}
		return nil
	})
	// And it goes on.
	add(t, p, msg("r1", clientpb.Lane_LANE_BULK, (t0Index+outage+1)*1000, 99))
	closeWindow(clock, p, t0Index+outage+1)
	fetch(t, srv, p, "r1", t0Index+outage+1)
}

// While storage hangs, Add returns at once: it never waits on a write.
func TestAddNeverWaitsOnStorage(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{Queue: 4, Writers: 1, WriteTimeout: time.Minute})
	srv.Freeze()
	defer srv.Thaw()

	var slowest time.Duration
	for w := int64(0); w < 20; w++ {
		for i := range 500 {
			start := time.Now()
			add(t, p, msg("r1", clientpb.Lane_LANE_BULK, (t0Index+w)*1000+int64(i), int(w)*1000+i))
			slowest = max(slowest, time.Since(start))
		}
		closeWindow(clock, p, t0Index+w)
	}
	// Under -race an Add takes microseconds, and a starved machine (load 20 on 2 cores) has
	// stretched one to 370 ms; waiting on the frozen store would take the write timeout, a
	// minute.
	if slowest > 5*time.Second {
		t.Fatalf("slowest Add took %v", slowest)
	}
	if n := p.queue.len(); n > 4 {
		t.Fatalf("%d segments queued, cap 4", n)
	}
	if got := promtest.ToFloat64(p.metrics.gaps[gapQueueFull]); got < 20-4-1 {
		t.Fatalf("%v gaps, want at least 15", got)
	}
}

// Close with storage down gives up when its context ends and counts what it could not write.
func TestCloseGivesUpWhenStorageIsDown(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, _ := start(t, srv, Config{RetryMin: 5 * time.Millisecond})
	srv.Stop()
	add(t, p, msg("r1", clientpb.Lane_LANE_BULK, t0, 1), msg("r2", clientpb.Lane_LANE_BULK, t0, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close: %v", err)
	}
	if got := promtest.ToFloat64(p.metrics.gaps[gapShutdown]); got != 2 {
		t.Fatalf("%v shutdown gaps, want 2", got)
	}
	if err := p.Close(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Close: %v", err)
	}
}

// A segment storage refuses for longer than GiveUpAfter is dropped and counted.
func TestGiveUp(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	p, clock := start(t, srv, Config{RetryMin: 5 * time.Millisecond, GiveUpAfter: 50 * time.Millisecond})
	srv.Stop()
	add(t, p, msg("r1", clientpb.Lane_LANE_BULK, t0, 1))
	closeWindow(clock, p, t0Index)
	waitCounter(t, p.metrics.gaps[gapGaveUp], 1)
	srv.Restart()
	missing(t, srv, p, "r1", t0Index)
}

// A handoff between two pushers at an index: the one that had the room writes the windows
// before it and forgets the room (a message stamped later is refused, and a straggler does not
// open the room again); the one that gets it writes from that index on, never before.
func TestHandoff(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	old, clock := start(t, srv, Config{})
	next, nextClock := start(t, srv, Config{})
	const at = t0Index + 2

	add(t, old, msg("r", clientpb.Lane_LANE_BULK, t0, 1))
	if err := next.Assign(app, "r", at); err != nil {
		t.Fatal(err)
	}
	old.Release(app, "r", at)
	add(t, old, msg("r", clientpb.Lane_LANE_BULK, t0+1000, 2))
	if err := old.Add(app, msg("r", clientpb.Lane_LANE_BULK, at*1000+5, 3)); !errors.Is(err, ErrReleased) {
		t.Fatalf("a message of the new pusher's window: %v, want ErrReleased", err)
	}
	add(t, next, msg("r", clientpb.Lane_LANE_BULK, at*1000+5, 4))
	for i := int64(0); i < 4; i++ {
		closeWindow(clock, old, t0Index+i)
		closeWindow(nextClock, next, t0Index+i)
	}
	for i, wantID := range map[int64]string{t0Index: "m1", t0Index + 1: "m2", at: "m4"} {
		if s := fetch(t, srv, old, "r", i); len(s.Messages) != 1 || string(s.Messages[0].Body) != wantID {
			t.Errorf("window %d: %v, want %s", i, s.Messages, wantID)
		}
	}
	waitCounter(t, next.metrics.segments, 2) // windows at and at+1 only
	if got := promtest.ToFloat64(old.metrics.segments); got != 2 {
		t.Errorf("the old pusher wrote %v segments, want 2 (the windows before the handoff)", got)
	}
	if err := old.Add(app, msg("r", clientpb.Lane_LANE_BULK, at*1000+900, 5)); !errors.Is(err, ErrReleased) || old.Rooms() != 0 {
		t.Fatalf("a straggler after the handoff: %v, %d rooms", err, old.Rooms())
	}
	if got := promtest.ToFloat64(old.metrics.refused[refusedReleased]); got != 2 {
		t.Errorf("the old pusher counted %v messages refused after the handoff, want 2", got)
	}
}
