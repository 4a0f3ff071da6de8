package room

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// startService starts an embedded NATS server and a room service on it (cfg's Bus set here),
// and returns the service, its registry and a second connection for the test.
func startService(t *testing.T, cfg Config) (*Service, *prometheus.Registry, *nats.Conn) {
	t.Helper()
	ns := testkit.NATS(t)
	reg := prometheus.NewRegistry()
	cfg.Bus, cfg.Registerer = testkit.Connect(t, ns), reg
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, reg, testkit.Connect(t, ns)
}

// roomBatches subscribes to a room's subject and returns the batches as they come.
func roomBatches(t *testing.T, nc *nats.Conn, room string) <-chan *buspb.RoomBatch {
	t.Helper()
	out := make(chan *buspb.RoomBatch, 10000)
	_, err := nc.Subscribe(bus.RoomSubject("a", room), func(m *nats.Msg) {
		var b buspb.RoomBatch
		if err := proto.Unmarshal(m.Data, &b); err != nil {
			t.Errorf("batch does not parse: %v", err)
		}
		out <- &b
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sendOne(t *testing.T, nc *nats.Conn, room, body string, lane clientpb.Lane) *buspb.Reply {
	t.Helper()
	var rep buspb.Reply
	req := &buspb.SendRequest{App: "a", Room: room, Lane: lane, Body: []byte(body)}
	if err := bus.Request(context.Background(), nc, bus.SubjectRoomSend, req, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Code != 0 {
		t.Fatalf("send refused: %v", &rep)
	}
	return &rep
}

// A window's sends leave as one batch, numbered 1, 2, 3, ... in the order they were accepted,
// and normal ones are answered before the window ends.
func TestBatchWindowGathersSends(t *testing.T) {
	t.Parallel()
	const window = 300 * time.Millisecond
	s, reg, nc := startService(t, Config{BatchWindow: window})
	batches := roomBatches(t, nc, "r")
	const n = 20
	start := time.Now()
	for i := range n {
		sendOne(t, nc, "r", fmt.Sprint(i), clientpb.Lane_LANE_NORMAL)
	}
	if took := time.Since(start); took >= window {
		t.Fatalf("%d sends took %v: a send waits for its window (%v)", n, took, window)
	}
	var got []*clientpb.Message
	deadline := time.After(5 * time.Second)
	count := 0
	for len(got) < n {
		select {
		case b := <-batches:
			got = append(got, b.Messages...)
			count++
		case <-deadline:
			t.Fatalf("got %d of %d messages", len(got), n)
		}
	}
	// All n were sent within one window, but the window may have begun by a timer that
	// started just before: two batches at most.
	if count > 2 {
		t.Errorf("%d messages came in %d batches, want 1 (2 if a window ended among them)", n, count)
	}
	for i, m := range got {
		if string(m.Body) != fmt.Sprint(i) || m.RoomSeq != uint64(i+1) {
			t.Fatalf("message %d: body %q room_seq %d, want %d and %d", i, m.Body, m.RoomSeq, i, i+1)
		}
	}
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error { // counted after its publish returns
		if v := testutil.ToFloat64(s.metrics.batches); v != float64(count) {
			return fmt.Errorf("batches_published_total = %v, want %d", v, count)
		}
		return nil
	})
	if _, err := reg.Gather(); err != nil {
		t.Error(err)
	}
}

// Numbering stays 1, 2, 3, ... across windows and across instances sharing the room: each
// window takes its numbers with one increment of the room's counter.
func TestBatchNumberingAcrossInstances(t *testing.T) {
	t.Parallel()
	s1, _, nc := startService(t, Config{BatchWindow: 10 * time.Millisecond})
	s2, err := New(Config{Bus: nc, BatchWindow: 15 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(); err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	watch, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	batches := roomBatches(t, watch, "r")
	const n = 200
	for i := range n {
		sendOne(t, nc, "r", fmt.Sprint(i), clientpb.Lane_LANE_NORMAL)
	}
	seen := make(map[uint64]bool)
	windows := 0
	for len(seen) < n {
		select {
		case b := <-batches:
			windows++
			for i, m := range b.Messages {
				if seen[m.RoomSeq] || m.RoomSeq < 1 || m.RoomSeq > n {
					t.Fatalf("room_seq %d repeated or out of 1..%d", m.RoomSeq, n)
				}
				if i > 0 && m.RoomSeq != b.Messages[i-1].RoomSeq+1 {
					t.Fatalf("a batch's numbers are not consecutive: %d after %d", m.RoomSeq, b.Messages[i-1].RoomSeq)
				}
				seen[m.RoomSeq] = true
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d of %d numbers", len(seen), n)
		}
	}
	if windows >= n {
		t.Errorf("%d messages came in %d batches: not batched", n, windows)
	}
	// A window is counted once its publish returns, which can be after the watcher got it.
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if c1, c2 := testutil.ToFloat64(s1.metrics.batches), testutil.ToFloat64(s2.metrics.batches); c1+c2 != float64(windows) {
			return fmt.Errorf("batches counted %v + %v, published %d", c1, c2, windows)
		}
		return nil
	})
}

// Close sends what is still in its window: a clean shutdown loses nothing.
func TestCloseSendsPendingWindow(t *testing.T) {
	t.Parallel()
	s, _, nc := startService(t, Config{BatchWindow: time.Hour})
	batches := roomBatches(t, nc, "r")
	sendOne(t, nc, "r", "last words", clientpb.Lane_LANE_NORMAL)
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case b := <-batches:
		if len(b.Messages) != 1 || string(b.Messages[0].Body) != "last words" {
			t.Fatalf("got %v", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pending message did not leave on Close")
	}
	<-done
}

// What a window of normal messages holds when the service loses its bus (as when its process
// dies) is lost: the sends were answered, the messages are neither delivered nor kept, and they
// are counted.
func TestLostBusLosesTheWindowCounted(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Millisecond
	s, _, nc := startService(t, Config{BatchWindow: window})
	batches := roomBatches(t, nc, "r")
	rep := sendOne(t, nc, "r", "accepted", clientpb.Lane_LANE_NORMAL)
	if rep.MessageId == "" {
		t.Fatal("no id for an accepted send")
	}
	s.cfg.Bus.Close()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(s.metrics.unsent) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("messages_unsent_total = %v, want 1", testutil.ToFloat64(s.metrics.unsent))
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case b := <-batches:
		t.Fatalf("a batch left after the bus closed: %v", b)
	case <-time.After(2 * window):
	}
}

// A critical send is answered only once its window is numbered, kept and published: when the
// answer comes the message is in the room's history, where a member recovering on any node
// finds it. Critical senders do not wait for each other's windows.
func TestCriticalSendAnsweredOnceKept(t *testing.T) {
	t.Parallel()
	const window, n = 300 * time.Millisecond, 20
	s, _, nc := startService(t, Config{BatchWindow: window})
	start := time.Now()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i] = sendOne(t, nc, "r", fmt.Sprint(i), clientpb.Lane_LANE_CRITICAL).MessageId })
	}
	wg.Wait()
	if took := time.Since(start); took > 5*window {
		t.Errorf("%d critical sends took %v: answered one window after another", n, took)
	}
	kept, _, err := historystore.Read(context.Background(), s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	inHistory := make(map[string]uint64)
	for _, k := range kept {
		inHistory[k.Msg.Id] = k.Msg.RoomSeq
	}
	for i, id := range ids {
		if seq, ok := inHistory[id]; !ok || seq == 0 {
			t.Errorf("critical message %d (%s) answered 200 but not numbered and kept (room_seq %d, kept %v)", i, id, seq, ok)
		}
	}
}

// A critical send whose window cannot be published is answered 503 (and counted), never 200.
func TestCriticalSendRefusedWhenNotSent(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{BatchWindow: 50 * time.Millisecond})
	s.cfg.Bus.Close()
	q, ok := s.SendLocalQueued(context.Background(), []*buspb.SendRequest{{App: "a", Room: "r", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("x")}})
	if !ok {
		t.Fatal("SendLocalQueued did not take the send")
	}
	rep := q.Reply()
	if rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE) {
		t.Fatalf("a critical send that was never published was answered %v", rep)
	}
	if v := testutil.ToFloat64(s.metrics.unsent); v != 1 {
		t.Errorf("messages_unsent_total = %v, want 1", v)
	}
}

// A room's bulk lane passes at most its cap a second; the rest is sampled out and counted.
// Critical and normal messages are never capped.
func TestBulkCapSamplesAndCounts(t *testing.T) {
	t.Parallel()
	s, _, nc := startService(t, Config{BatchWindow: -1, BulkPerSecond: 10, Now: func() time.Time { return time.Unix(1000, 0) }})
	batches := roomBatches(t, nc, "r")
	for i := range 30 {
		lane := clientpb.Lane_LANE_BULK
		if i%3 == 0 {
			lane = clientpb.Lane_LANE_CRITICAL
		}
		sendOne(t, nc, "r", fmt.Sprint(i), lane)
	}
	lanes := make(map[clientpb.Lane]int)
	for range 20 { // 10 critical, 10 of the 20 bulk
		select {
		case b := <-batches:
			for _, m := range b.Messages {
				lanes[m.Lane]++
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("got %v", lanes)
		}
	}
	select {
	case b := <-batches:
		t.Fatalf("more than the cap passed: %v after %v", b, lanes)
	case <-time.After(200 * time.Millisecond):
	}
	if lanes[clientpb.Lane_LANE_CRITICAL] != 10 || lanes[clientpb.Lane_LANE_BULK] != 10 {
		t.Errorf("passed %v, want 10 critical and 10 bulk", lanes)
	}
	if v := testutil.ToFloat64(s.metrics.bulkSampled); v != 10 {
		t.Errorf("bulk_sampled_out_total = %v, want 10", v)
	}
}

func TestBulkCapRefills(t *testing.T) {
	t.Parallel()
	c := newBulkCap()
	k := roomKey{"a", "r"}
	now := time.Unix(0, 0)
	bulk := func(n int) ([]*clientpb.Message, []string) {
		msgs, senders := make([]*clientpb.Message, n), make([]string, n)
		for i := range msgs {
			msgs[i] = &clientpb.Message{Lane: clientpb.Lane_LANE_BULK, Id: fmt.Sprint(i)}
		}
		return msgs, senders
	}
	for _, step := range []struct {
		after       time.Duration
		send, kept  int
		description string
	}{
		{0, 150, 100, "a full bucket passes one second's worth"},
		{100 * time.Millisecond, 50, 10, "a tenth of a second refills a tenth"},
		{10 * time.Second, 300, 100, "an idle room's bucket is full, not more"},
	} {
		now = now.Add(step.after)
		msgs, senders := bulk(step.send)
		kept, _, out := c.keep(k, 100, nil, now, msgs, senders)
		if len(kept) != step.kept || out != step.send-step.kept {
			t.Errorf("%s: kept %d, sampled out %d; want %d, %d", step.description, len(kept), out, step.kept, step.send-step.kept)
		}
		if len(kept) > 1 && kept[0].Id >= kept[1].Id && len(kept[0].Id) == len(kept[1].Id) {
			t.Errorf("%s: order not kept", step.description)
		}
	}
	c.expire(now.Add(2 * time.Second))
	if len(c.rooms) != 0 {
		t.Errorf("an idle room's bucket was kept")
	}
}
