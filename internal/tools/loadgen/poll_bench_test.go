package loadgen

import (
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

// BenchmarkRawPollers: raw TCP members read by the pollers, as in a fan-out run; an op is one
// Push of 5 messages written to one of 256 members, read and handed to onMsg. Run it under
// taskset -c 1 (one core, one poller) and ns/op is about the CPU a frame costs the bench and
// the sender's write together.
func BenchmarkRawPollers(b *testing.B) {
	const members, perFrame = 256, 5
	rp, err := newRawPollers()
	if err != nil {
		b.Fatal(err)
	}
	if rp == nil {
		b.Skip("no pollers on this platform")
	}
	defer rp.stop()
	var got atomic.Int64
	peers := make([]interface{ Write([]byte) (int, error) }, members)
	for i := range peers {
		s, peer := testkit.TCPPair(b)
		c := &rawClient{nc: s, acked: make(chan struct{}), done: make(chan struct{}),
			onMsg: func(int32, []byte) { got.Add(1) }}
		if err := rp.add(c); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		peers[i] = peer
	}
	push := &clientpb.Push{}
	for range perFrame {
		push.Messages = append(push.Messages, &clientpb.Message{Lane: clientpb.Lane_LANE_CRITICAL, Body: make([]byte, 64)})
	}
	pb, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: push}})
	if err != nil {
		b.Fatal(err)
	}
	frame := lengthPrefixed(pb)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := testkit.ProcessCPU()
	for i := range b.N {
		if _, err := peers[i%members].Write(frame); err != nil {
			b.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); got.Load() < int64(b.N*perFrame); {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages", got.Load(), b.N*perFrame)
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
