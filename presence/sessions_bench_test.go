package presence

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
)

// sessionLoad is the sessions a memory measurement logs in: n members spread over nodes
// ChatLinks, in one room or each in a room of its own, named as `roomcast bench` and the
// ChatLinks name them.
type sessionLoad struct {
	n, nodes int
	ownRooms bool
}

// feed logs the load's sessions into s through its session stream, a batch of 100 events at
// a time as the ChatLinks publish them.
func (l sessionLoad) feed(tb testing.TB, s *Service) {
	const run, perBatch = "e39b54c2", 100
	seqs := make([]uint64, l.nodes)     // each node's stream
	sessions := make([]uint64, l.nodes) // each node's sessions, numbered as a ChatLink does
	for first := 0; first < l.n; first += perBatch {
		node := first / perBatch % l.nodes
		evs := &buspb.SessionEvents{Node: fmt.Sprintf("edge-%d", node+1), Boot: "b1"}
		for i := first; i < min(first+perBatch, l.n); i++ {
			sessions[node]++
			room := "bench-" + run
			if l.ownRooms {
				room = fmt.Sprintf("bench-%s-%d", run, i)
			}
			evs.Events = append(evs.Events, &buspb.SessionEvent{
				Kind: buspb.SessionEvent_KIND_LOGIN, App: "demo", Uid: fmt.Sprintf("bench-%s-%d", run, i), Room: room,
				Node: evs.Node, SessionId: ids.SessionID(evs.Node, sessions[node]), Device: "web", TimeMs: 1_796_000_000_000 + int64(i),
			})
		}
		seqs[node]++
		evs.Seq = seqs[node]
		data, err := proto.Marshal(evs)
		if err != nil {
			tb.Fatal(err)
		}
		s.onStream(&nats.Msg{Subject: bus.SubjectPresenceEvents, Data: data})
	}
	if got := s.Sessions(); got != l.n {
		tb.Fatalf("%d sessions, want %d", got, l.n)
	}
}

// heapPerSession returns the live heap a service holding the load's sessions takes, per
// session, after a full collection before and after.
func (l sessionLoad) heapPerSession(tb testing.TB) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := New(Config{Bus: new(nats.Conn)}) // never dialed: the stream is fed by hand
	if err != nil {
		tb.Fatal(err)
	}
	l.feed(tb, s)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(l.n)
}

// BenchmarkSessionMemory reports the heap an instance's replica of the sessions takes, per
// session, with 250,000 sessions over 14 ChatLinks (docs/scale.md): in one room, and each in
// a room of its own. Run it with -benchtime 1x: each iteration builds the replica again.
func BenchmarkSessionMemory(b *testing.B) {
	for _, l := range []sessionLoad{{n: 250_000, nodes: 14}, {n: 250_000, nodes: 14, ownRooms: true}} {
		name := "OneRoom"
		if l.ownRooms {
			name = "RoomEach"
		}
		b.Run(fmt.Sprintf("%s/%d", name, l.n), func(b *testing.B) {
			var per float64
			for b.Loop() {
				per = l.heapPerSession(b)
			}
			b.ReportMetric(per, "B/session")
		})
	}
}
