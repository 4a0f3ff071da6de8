package cdnpusher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	msgids "roomcast/internal/ids"
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

// sizeStore keeps the size of the last segment put.
type sizeStore struct{ last atomic.Int64 }

func (s *sizeStore) put(_ context.Context, _ string, body []byte) error {
	s.last.Store(int64(len(body)))
	return nil
}

// BenchmarkSegmentBytes is the size on storage of a room's segment (protobuf, gzipped), as the
// pusher writes it, for a quiet window, a window of 10 messages and a full one (the cap, 200):
// ULID ids, a room sequence, senders among 10,000 users, danmaku bodies of 3 to 33 bytes. The
// figure behind the storage a room in CDN mode costs a day (docs/cdn.md). Run it as
// `go test -run XXX -bench SegmentBytes ./cdnpusher`.
func BenchmarkSegmentBytes(b *testing.B) {
	bodies := []string{"666", "哈哈哈哈哈", "主播好", "前方高能", "awesome!!", "gg", "lol that was close", "来了来了",
		"这波操作可以", "hello from Berlin", "？？？", "打call", "yyds", "太强了吧", "first time here, love it", "2333333"}
	for _, n := range []int{0, 10, DefaultMaxMessages} {
		b.Run(fmt.Sprintf("msgs=%d", n), func(b *testing.B) {
			clock := testkit.NewClock(time.UnixMilli(t0))
			p, err := New(Config{Endpoint: "127.0.0.1:1", Bucket: "b", Now: clock.Now, SegmentTTL: -1})
			if err != nil {
				b.Fatal(err)
			}
			sizes := &sizeStore{}
			p.store = sizes
			defer func() { _ = p.Close(context.Background()) }()
			var gen msgids.Generator
			rng := rand.New(rand.NewPCG(1, 2))
			var total int64
			index := int64(t0Index)
			for i := range b.N {
				if err := p.Open(app, "lobby"); err != nil {
					b.Fatal(err)
				}
				for k := range n {
					ms := index*1000 + int64(k*1000/n)
					m := &clientpb.Message{
						Id: gen.New(time.UnixMilli(ms)), Room: "lobby", Sender: fmt.Sprintf("user-%d", rng.IntN(10_000)),
						Type: "danmaku", Lane: clientpb.Lane_LANE_BULK, Body: []byte(bodies[rng.IntN(len(bodies))]),
						ServerTimeMs: ms, RoomSeq: uint64(i*n + k + 1),
					}
					if err := p.Add(app, m); err != nil {
						b.Fatal(err)
					}
				}
				closeWindow(clock, p, index)
				index++
				deadline := time.Now().Add(5 * time.Second)
				for sizes.last.Load() == 0 {
					if time.Now().After(deadline) {
						b.Fatal("segment not written")
					}
					time.Sleep(10 * time.Microsecond)
				}
				total += sizes.last.Swap(0)
			}
			b.ReportMetric(float64(total)/float64(b.N), "bytes/segment")
		})
	}
}
