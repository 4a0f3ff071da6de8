package chatlink

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
)

// BenchmarkRoomReceive measures a room batch taken off the bus in the order its numbers came
// (the path every batch takes when nothing is missing): a batch of 5 numbered critical
// messages, unmerged, written to a room of 100 members.
func BenchmarkRoomReceive(b *testing.B) {
	r := testRoom(Config{Node: "n1"}, &pb.RoomSettings{NoMerge: true}, time.Now())
	defer r.fanout.stop()
	for range 100 {
		r.testJoin(&nullTransport{})
	}
	var seq uint64
	batch := &pb.RoomBatch{}
	for range 5 {
		batch.Messages = append(batch.Messages, &pb.Message{Id: "m", Lane: pb.Lane_LANE_CRITICAL, Body: make([]byte, 64)})
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for _, m := range batch.Messages {
			seq++
			m.RoomSeq = seq
		}
		data, err := proto.Marshal(batch)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		r.receive(data)
	}
}
