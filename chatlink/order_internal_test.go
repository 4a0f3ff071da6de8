package chatlink

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// BenchmarkRoomReceive measures a room batch taken off the bus in the order its numbers came
// (the path every batch takes when nothing is missing): a batch of 5 numbered critical
// messages, unmerged, written to a room of 100 members.
func BenchmarkRoomReceive(b *testing.B) {
	r := testRoom(Config{Node: "n1"}, &roompb.RoomSettings{NoMerge: true}, time.Now())
	defer r.fanout.stop()
	for range 100 {
		r.testJoin(&nullTransport{})
	}
	var seq uint64
	batch := &buspb.RoomBatch{}
	for range 5 {
		batch.Messages = append(batch.Messages, &clientpb.Message{Id: "m", Lane: clientpb.Lane_LANE_CRITICAL, Body: make([]byte, 64)})
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

// receiveSeqs hands the room a batch of critical messages numbered seqs (0: a bulk message),
// each with its number as its id.
func (r *localRoom) receiveSeqs(seqs ...uint64) {
	var b buspb.RoomBatch
	for _, s := range seqs {
		m := &clientpb.Message{Id: strconv.FormatUint(s, 10), Lane: clientpb.Lane_LANE_CRITICAL, RoomSeq: s}
		if s == 0 {
			m.Id, m.Lane = "bulk", clientpb.Lane_LANE_BULK
		}
		b.Messages = append(b.Messages, m)
	}
	data, err := proto.Marshal(&b)
	if err != nil {
		panic(err)
	}
	r.receive(data)
}

// TestRoomOrderLive: without the history (the hold never runs out here), numbered batches go
// out in room_seq order: one ahead of a gap waits, its bulk message does not, and the gap's
// batch releases it; the first batch a room sees sets where it starts; a batch numbered far
// below means the room's numbers started again.
func TestRoomOrderLive(t *testing.T) {
	t.Parallel()
	r := testRoom(Config{Node: "n1", OrderHold: time.Hour}, &roompb.RoomSettings{NoMerge: true}, time.Now())
	r.t.n.log = slog.New(slog.DiscardHandler) // the restart is logged
	defer r.fanout.stop()
	rec := &pushRecorder{}
	r.testJoin(rec)
	const b = 1 << 20
	r.receiveSeqs(b)           // where the room starts on this node
	r.receiveSeqs(b+3, 0, b+4) // ahead of b+1: held, but not the bulk
	r.receiveSeqs(b + 2)       // still behind b+1
	r.receiveSeqs(b + 1)       // releases b+2, then b+3 and b+4
	r.receiveSeqs(b + 5)
	r.receiveSeqs(2) // the room's numbers started again
	r.receiveSeqs(3)
	want := fmt.Sprint([]uint64{b, 0, b + 1, b + 2, b + 3, b + 4, b + 5, 2, 3})
	want = strings.Replace(want, " 0 ", " bulk ", 1)
	if got := fmt.Sprint(rec.ids()); got != want {
		t.Errorf("delivered %s, want %s", got, want)
	}
	if r.fanout.order.next != 4 {
		t.Errorf("next number %d after the restart, want 4", r.fanout.order.next)
	}
	if got := len(r.fanout.order.held); got != 0 {
		t.Errorf("%d batches still held", got)
	}
}
