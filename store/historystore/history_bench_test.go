package historystore

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

// BenchmarkReadHistory reads a room of 20 kept messages (one direct get), as a login's
// recovery does, one read at a time and many at once (a reconnect storm's recovery reads), and
// a room that keeps nothing (the read's fixed cost).
func BenchmarkReadHistory(b *testing.B) {
	_, _, js := historyStream(b)
	ctx := context.Background()
	const rooms, perRoom = 8, 20
	for i := range rooms * perRoom {
		body, _ := proto.Marshal(&clientpb.Message{Id: fmt.Sprint(i), Body: []byte("a message of a room's history")})
		if _, err := js.Publish(ctx, Subject("a", fmt.Sprint(i%rooms)), body); err != nil {
			b.Fatal(err)
		}
	}
	read := func(b *testing.B, room string) {
		want := perRoom
		if room == "empty" {
			want = 0
		}
		kept, _, err := Read(ctx, js, "a", room, Range{})
		if err != nil || len(kept) != want {
			b.Fatalf("read %d messages (%v), want %d", len(kept), err, want)
		}
	}
	// cpu-ns/op is the whole process's CPU (the reader and the embedded server) per read.
	for _, c := range []struct{ name, room string }{{"serial", "0"}, {"empty", "empty"}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := testkit.ProcessCPU()
			for b.Loop() {
				read(b, c.room)
			}
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16) // many logins' reads at once on one connection
		cpu := testkit.ProcessCPU()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				read(b, fmt.Sprint(i%rooms))
			}
		})
		b.ReportMetric(float64(testkit.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
	})
}
