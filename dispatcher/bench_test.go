package dispatcher

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
)

// benchDispatcher is a dispatcher on the real clock with 1,000 nodes spread over Chinese
// provinces (three carriers) and a few other countries, with uneven loads, and the fixture
// databases loaded. Clients come from four fixture networks in different buckets. Each node
// reports 100 rooms it holds, drawn from benchRooms, so a room is held by about ten nodes.
func benchDispatcher(b *testing.B, cacheTTL time.Duration) (*Dispatcher, []netip.Addr) {
	city, isp := writeFixture(b, b.TempDir())
	d, err := New(Config{
		Bus: &nats.Conn{}, CityDB: city, ISPDB: isp, CacheTTL: cacheTTL,
		StaleAfter: time.Hour, GeoCheckInterval: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	rng := rand.New(rand.NewPCG(1, 2))
	regions := []string{"AS/JP/13", "EU/GB/ENG", "NA/US/CA", "AS/SG"}
	for p := 11; p <= 65; p++ {
		regions = append(regions, fmt.Sprintf("AS/CN/%d", p))
	}
	carriers := []string{"unicom", "telecom", "mobile", "AS4134,AS4837"}
	for i := range 1000 {
		r := nodeReport(fmt.Sprintf("n%04d", i), regions[rng.IntN(len(regions))], carriers[rng.IntN(len(carriers))],
			rng.Int64N(80_000), 100_000)
		r.Cpu, r.FlowControlStrength, r.BusRttUs = rng.Float64()*0.8, rng.Float64()*0.5, 200+rng.Int64N(20_000)
		r.EgressCapacityBytesPerSec = 1 << 30
		r.EgressBytesPerSec = rng.Int64N(1 << 29)
		for range 100 {
			r.RoomsHeld = append(r.RoomsHeld, &buspb.RoomCount{App: "demo", Room: fmt.Sprintf("r%d", rng.IntN(benchRooms)), Members: 1 + rng.Int64N(5000)})
		}
		report(d, r)
	}
	// The reports' garbage is not the decisions': collect it before the clock starts.
	runtime.GC()
	clients := []netip.Addr{
		netip.MustParseAddr("175.16.199.7"), netip.MustParseAddr("123.112.4.5"),
		netip.MustParseAddr("180.160.9.9"), netip.MustParseAddr("81.2.69.142"),
	}
	return d, clients
}

// BenchmarkDispatchCached is the flash-crowd path: every decision's bucket has a cached
// ranking (rebuilt whenever it expires or its candidates fill up), so a decision is a
// database tree walk per database, a cache read and a rescoring of the bucket's candidates.
func BenchmarkDispatchCached(b *testing.B) {
	d, clients := benchDispatcher(b, time.Second)
	b.ReportAllocs()
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		if _, err := d.Dispatch(Request{Client: clients[i&3]}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// benchRooms is how many rooms the bench nodes hold.
const benchRooms = 10_000

// BenchmarkDispatchRoomCached is the cached path for members of rooms (room affinity): the
// candidates are rescored and the room's holders (about ten) are looked up and scored too.
// Requests go to 4,096 rooms in turn, so the room table is mostly out of the CPU's caches.
func BenchmarkDispatchRoomCached(b *testing.B) {
	benchRoomDispatch(b, time.Second, 4096)
}

// BenchmarkDispatchRoomCachedHot is a flash crowd: the members of 16 rooms.
func BenchmarkDispatchRoomCachedHot(b *testing.B) {
	benchRoomDispatch(b, time.Second, 16)
}

// BenchmarkDispatchRoomUncached is the uncached path for members of rooms.
func BenchmarkDispatchRoomUncached(b *testing.B) {
	benchRoomDispatch(b, -1, 4096)
}

func benchRoomDispatch(b *testing.B, cacheTTL time.Duration, rooms int) {
	d, clients := benchDispatcher(b, cacheTTL)
	reqs := make([]Request, 4096)
	for i := range reqs {
		room := (i * 7919) % benchRooms // 4,096 different rooms
		if rooms < len(reqs) {
			room = i % rooms
		}
		reqs[i] = Request{Client: clients[i&3], App: "demo", Room: fmt.Sprintf("r%d", room)}
	}
	d.mu.Lock()
	nodes := slices.Collect(maps.Values(d.nodes))
	d.mu.Unlock()
	runtime.GC()
	b.ReportAllocs()
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		if _, err := d.Dispatch(reqs[i&4095]); err != nil {
			b.Fatal(err)
		}
		i++
		if i&0xffff == 0 {
			// What the nodes' next reports would do: a room's few holders in a client's
			// region would otherwise fill up over millions of decisions, and the benchmark
			// would measure full nodes instead of a decision.
			for _, n := range nodes {
				n.assigned.Store(0)
			}
		}
	}
}

// BenchmarkDispatchUncached scores all 1,000 nodes on every decision.
func BenchmarkDispatchUncached(b *testing.B) {
	d, clients := benchDispatcher(b, -1)
	b.ReportAllocs()
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		if _, err := d.Dispatch(Request{Client: clients[i&3]}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkDispatchUncachedUnlocated is the worst case of the uncached path: a client that
// cannot be located (no database entry, private address) puts every node in one locality
// class, so all 1,000 are fully scored.
func BenchmarkDispatchUncachedUnlocated(b *testing.B) {
	d, _ := benchDispatcher(b, -1)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if _, err := d.Dispatch(Request{}); err != nil {
			b.Fatal(err)
		}
	}
}

// reportCPU adds a cpu-ns/op metric: the process's CPU time (user and system, garbage
// collection included) per decision. On a machine shared with other work, ns/op (wall time)
// includes time spent waiting for a core; cpu-ns/op does not.
func reportCPU(b *testing.B) func() {
	start := testkit.ProcessCPU()
	return func() { b.ReportMetric(float64(testkit.ProcessCPU()-start)/float64(b.N), "cpu-ns/op") }
}
