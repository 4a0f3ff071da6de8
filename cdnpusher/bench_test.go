package cdnpusher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

// discardStore takes every segment and keeps nothing: the benchmark measures the pusher, not
// storage.
type discardStore struct{}

func (discardStore) put(context.Context, string, []byte) error { return nil }

var _ store = discardStore{}

// BenchmarkAggregate is the pusher's aggregation rate: messages through Add, windows closed,
// sampled to the cap, ordered, encoded and gzipped into segments, handed to the writers. 128
// rooms get 512 messages each per window (mostly bulk, some normal and critical), so every
// window samples. Run it as `go test -bench Aggregate -cpu 1 ./cdnpusher`; msgs/cpu-s counts
// the whole process's CPU time (the writers' and the sealer's too).
func BenchmarkAggregate(b *testing.B) {
	const (
		rooms     = 128
		perWindow = rooms * 512
	)
	clock := testkit.NewClock(time.UnixMilli(t0))
	p, err := New(Config{Endpoint: "127.0.0.1:1", Bucket: "b", Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	p.store = discardStore{}
	defer func() { _ = p.Close(context.Background()) }()

	// One window's worth of messages, restamped for each window: Add keeps a message only
	// until its window is written out, which happens before the next window starts.
	msgs := make([]*clientpb.Message, perWindow)
	for i := range msgs {
		lane := clientpb.Lane_LANE_BULK
		switch {
		case i%100 == 0:
			lane = clientpb.Lane_LANE_CRITICAL
		case i%20 == 0:
			lane = clientpb.Lane_LANE_NORMAL
		}
		msgs[i] = &clientpb.Message{
			Id: fmt.Sprintf("01KB%022d", i), Room: fmt.Sprintf("room-%d", i%rooms), Sender: fmt.Sprintf("u%d", i%5000),
			Type: "danmaku", Lane: lane, Body: []byte("hahahahaha 666 主播好"),
		}
	}
	b.ReportAllocs()
	cpu := testkit.ProcessCPU()
	b.ResetTimer()
	index := int64(t0Index)
	for i := range b.N {
		k := i % perWindow
		if k == 0 && i > 0 {
			closeWindow(clock, p, index)
			index++
		}
		m := msgs[k]
		m.ServerTimeMs = index*1000 + int64(k*1000/perWindow)
		if err := p.Add(app, m); err != nil {
			b.Fatal(err)
		}
	}
	closeWindow(clock, p, index)
	b.StopTimer()
	used := testkit.ProcessCPU() - cpu
	b.ReportMetric(float64(b.N)/used.Seconds(), "msgs/cpu-s")
	b.ReportMetric(float64(index-t0Index+1)*rooms/used.Seconds(), "segments/cpu-s")
}
