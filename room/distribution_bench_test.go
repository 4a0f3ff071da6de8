package room

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
)

// BenchmarkDistributionMemory reports the heap an instance's view of the members takes, per
// member, with 250,000 members over 14 ChatLinks as their reports tell it (docs/scale.md): the
// room service keeps a count per room and node, not the sessions, so one big room costs next
// to nothing a member and a room each costs one entry a member. Run it with -benchtime 1x.
func BenchmarkDistributionMemory(b *testing.B) {
	const members, nodes, perReport = 250_000, 14, 1000
	for _, ownRooms := range []bool{false, true} {
		name := "OneRoom"
		if ownRooms {
			name = "RoomEach"
		}
		b.Run(fmt.Sprintf("%s/%d", name, members), func(b *testing.B) {
			var per float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				d := newDistribution()
				for n := range nodes {
					rep := &buspb.NodeReport{Node: fmt.Sprintf("edge-%d", n+1), Boot: "b1", Seq: 1}
					on := members / nodes
					if !ownRooms {
						rep.Rooms = []*buspb.RoomCount{{App: "demo", Room: "bench-e39b54c2", Members: int64(on)}}
					}
					for i := 0; ownRooms && i < on; i++ {
						rep.Rooms = append(rep.Rooms, &buspb.RoomCount{App: "demo", Room: fmt.Sprintf("bench-e39b54c2-%d", n*on+i), Members: 1})
						if len(rep.Rooms) == perReport || i == on-1 {
							rep.Last = i == on-1
							data, err := proto.Marshal(rep)
							if err != nil {
								b.Fatal(err)
							}
							d.onReport(&nats.Msg{Data: data})
							rep.Rooms = rep.Rooms[:0]
						}
					}
					if !ownRooms {
						rep.Last = true
						data, err := proto.Marshal(rep)
						if err != nil {
							b.Fatal(err)
						}
						d.onReport(&nats.Msg{Data: data})
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				runtime.KeepAlive(d)
				per = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(members/nodes*nodes)
			}
			b.ReportMetric(per, "B/member")
		})
	}
}
