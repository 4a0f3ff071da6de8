package historystore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

// historyStream starts an embedded NATS server with Stream, as the room service creates
// it, and connects to it.
func historyStream(t testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns := testkit.NATS(t)
	nc := testkit.Connect(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: Stream, Subjects: []string{Subject("*", "*")}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	return ns, nc, js
}

// TestReadHistory reads a room's history over several batches, among another room's messages
// and one that does not decode, from a sequence, from a time, and keeping the newest few.
func TestReadHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, js := historyStream(t)
	old := historyBatch
	historyBatch = 4
	defer func() { historyBatch = old }()

	if kept, skipped, err := Read(ctx, js, "a", "empty", Range{}); err != nil || len(kept) != 0 || skipped != 0 {
		t.Fatalf("empty room: %v, %d, %v", kept, skipped, err)
	}
	start := time.Now().Add(-time.Hour)
	var seqs []uint64
	for i := range 11 {
		b, _ := proto.Marshal(&clientpb.Message{Id: fmt.Sprint(i), ServerTimeMs: start.Add(time.Duration(i) * time.Minute).UnixMilli()})
		ack, err := js.Publish(ctx, Subject("a", "r"), b)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
		if _, err := js.Publish(ctx, Subject("a", "other"), b); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			if _, err := js.Publish(ctx, Subject("a", "r"), []byte{0xff}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := func(kept []KeptMessage) []string {
		var out []string
		for _, k := range kept {
			out = append(out, k.Msg.Id)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		r    Range
		want []string
	}{
		{"all", Range{}, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}},
		{"from a sequence", Range{FromSeq: seqs[7]}, []string{"7", "8", "9", "10"}},
		{"since a time", Range{Since: start.Add(150 * time.Second)}, []string{"3", "4", "5", "6", "7", "8", "9", "10"}},
		{"the newest 3", Range{Keep: 3}, []string{"8", "9", "10"}},
	} {
		kept, skipped, err := Read(ctx, js, "a", "r", tc.r)
		if err != nil || !slices.Equal(ids(kept), tc.want) {
			t.Errorf("%s: %v (%v), want %v", tc.name, ids(kept), err, tc.want)
		}
		if wantSkipped := tc.r.FromSeq == 0; (skipped == 1) != wantSkipped {
			t.Errorf("%s: skipped %d", tc.name, skipped)
		}
		for i := 1; i < len(kept); i++ {
			if kept[i].Seq <= kept[i-1].Seq {
				t.Errorf("%s: sequences out of order: %d after %d", tc.name, kept[i].Seq, kept[i-1].Seq)
			}
		}
	}
}

// TestReadHistoryRecords reads a room whose entries are records of several messages
// (RecordHeader) and single messages an older version wrote: the messages oldest first
// at their (seq, index), a time and a count applied per message, and the records' count
// retention.
func TestReadHistoryRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, js := historyStream(t)
	start := time.Now().Add(-time.Hour)
	msg := func(i int) *clientpb.Message {
		return &clientpb.Message{Id: fmt.Sprint(i), ServerTimeMs: start.Add(time.Duration(i) * time.Minute).UnixMilli()}
	}
	publish := func(retention string, msgs ...*clientpb.Message) {
		t.Helper()
		m := nats.NewMsg(Subject("a", "r"))
		if retention == "" { // a single message, as versions before records wrote
			m.Data, _ = proto.Marshal(msgs[0])
		} else {
			m.Header.Set(RecordHeader, retention)
			m.Data, _ = proto.Marshal(&buspb.HistoryRecord{Messages: msgs})
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("", msg(0))
	publish("100", msg(1), msg(2), msg(3))
	publish("", msg(4))
	publish("100", msg(5), msg(6))
	positions := func(kept []KeptMessage) []string {
		var out []string
		for _, k := range kept {
			out = append(out, fmt.Sprintf("%s@%d.%d", k.Msg.Id, k.Seq, k.Index))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		r    Range
		want []string
	}{
		{"all", Range{}, []string{"0@1.0", "1@2.0", "2@2.1", "3@2.2", "4@3.0", "5@4.0", "6@4.1"}},
		{"from a record", Range{FromSeq: 2}, []string{"1@2.0", "2@2.1", "3@2.2", "4@3.0", "5@4.0", "6@4.1"}},
		{"since a time", Range{Since: start.Add(90 * time.Second)}, []string{"2@2.1", "3@2.2", "4@3.0", "5@4.0", "6@4.1"}},
		{"the newest 4", Range{Keep: 4}, []string{"3@2.2", "4@3.0", "5@4.0", "6@4.1"}},
	} {
		kept, skipped, err := Read(ctx, js, "a", "r", tc.r)
		if err != nil || skipped != 0 || !slices.Equal(positions(kept), tc.want) {
			t.Errorf("%s: %v (%d skipped, %v), want %v", tc.name, positions(kept), skipped, err, tc.want)
		}
	}
	// The newest record says the room keeps 3 messages: a read without a count of its own
	// gives no more, one with a smaller count its own.
	publish("3", msg(7), msg(8))
	for keep, want := range map[int][]string{0: {"6", "7", "8"}, 10: {"6", "7", "8"}, 2: {"7", "8"}} {
		kept, _, err := Read(ctx, js, "a", "r", Range{Keep: keep})
		var got []string
		for _, k := range kept {
			got = append(got, k.Msg.Id)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("keep %d: %v (%v), want %v", keep, got, err, want)
		}
	}
}
