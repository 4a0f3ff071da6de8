package dispatcher

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func firstChoices(t *testing.T, d *Dispatcher, req Request, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		ans, err := d.Dispatch(req)
		if err != nil {
			t.Fatal(err)
		}
		got[ans.Nodes[0].Node]++
	}
	return got
}

// The acceptance test of the issue: 10 equal nodes, 100,000 clients between two load reports.
// A dispatcher that trusted the reports alone would send every one of them to the same node.
func TestFlashCrowd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"cached", Config{}},
		{"uncached", Config{CacheTTL: -1}},
		{"strict order", Config{NearEqual: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, clock := newTest(t, tc.cfg)
			for i := range 10 {
				report(d, nodeReport(fmt.Sprintf("n%d", i), "", "", 1000, 50_000))
			}
			const clients = 100_000
			got := map[string]int{}
			for i := range clients {
				if i%10_000 == 0 {
					clock.Add(50 * time.Millisecond) // the crowd arrives over half a second
				}
				ans, err := d.Dispatch(Request{})
				if err != nil {
					t.Fatal(err)
				}
				got[ans.Nodes[0].Node]++
			}
			least, most := clients, 0
			for _, c := range got {
				least, most = min(least, c), max(most, c)
			}
			if len(got) != 10 || float64(most) > 1.2*float64(least) {
				t.Fatalf("first choices %v: busiest %d, least busy %d (at most 1.2x allowed)", got, most, least)
			}
			t.Logf("first choices: busiest %d, least busy %d: %v", most, least, got)
		})
	}
}

func TestBurstAvoidsBusyNode(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	for _, n := range []string{"a", "b", "c"} {
		report(d, nodeReport(n, "", "", 0, 1000))
	}
	report(d, nodeReport("busy", "", "", 900, 1000))
	got := firstChoices(t, d, Request{}, 300)
	// 300 clients on three nodes 90% emptier than the busy one: none reaches it, and they
	// spread over the three.
	if got["busy"] != 0 || got["a"] < 60 || got["b"] < 60 || got["c"] < 60 {
		t.Fatalf("first choices %v", got)
	}
}

func TestNearEqualRandomises(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	report(d, nodeReport("a", "", "", 0, 1_000_000))
	report(d, nodeReport("b", "", "", 0, 1_000_000))
	got := firstChoices(t, d, Request{}, 1000)
	if got["a"] < 300 || got["b"] < 300 {
		t.Fatalf("two equal nodes, first choices %v: want both picked often", got)
	}

	strict, _ := newTest(t, Config{NearEqual: -1, CacheTTL: -1})
	report(strict, nodeReport("a", "", "", 0, 1_000_000))
	report(strict, nodeReport("b", "", "", 10, 1_000_000))
	for range 5 {
		if ans, _ := strict.Dispatch(Request{}); ans.Nodes[0].Node != "a" {
			t.Fatalf("without randomisation the emptier node comes first, got %+v", ans)
		}
	}
}

func TestAnswer(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{TopK: 2, TTL: 5 * time.Second})
	if _, err := d.Dispatch(Request{}); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("no nodes at all: err %v, want ErrNoNodes", err)
	}
	for _, n := range []string{"a", "b", "c"} {
		report(d, nodeReport(n, "", "", 0, 0))
	}
	ans, err := d.Dispatch(Request{})
	if err != nil {
		t.Fatal(err)
	}
	if ans.TTLMS != 5000 || len(ans.Nodes) != 2 || ans.Nodes[0].Node == ans.Nodes[1].Node {
		t.Fatalf("answer %+v: want 2 distinct nodes and ttl 5000", ans)
	}
	e := ans.Nodes[0]
	if e.WSURL != "ws://"+e.Node+".test/v1/ws" || e.TCPAddr != e.Node+".test:9000" {
		t.Fatalf("endpoint %+v", e)
	}
}

func TestStaleAndDraining(t *testing.T) {
	t.Parallel()
	d, clock := newTest(t, Config{})
	r := nodeReport("old", "", "", 0, 0)
	r.ReportIntervalMs = 1000
	report(d, r)
	report(d, nodeReport("fresh", "", "", 0, 0))
	drain := nodeReport("draining", "", "", 0, 0)
	drain.Draining = true
	report(d, drain)

	// "old" reports every second: two missed reports keep it, three take it out.
	clock.Add(2500 * time.Millisecond)
	report(d, nodeReport("fresh", "", "", 0, 0))
	if got := firstChoices(t, d, Request{}, 200); got["old"] == 0 || got["draining"] != 0 {
		t.Fatalf("first choices %v: want old still in, draining never", got)
	}
	clock.Add(1100 * time.Millisecond)
	report(d, nodeReport("fresh", "", "", 0, 0))
	report(d, drain)
	if got := firstChoices(t, d, Request{}, 50); got["old"] != 0 || got["fresh"] != 50 {
		t.Fatalf("first choices %v: want only fresh once old missed 3 reports", got)
	}
	if n := d.LiveNodes(); n != 2 {
		t.Fatalf("LiveNodes = %d, want 2 (fresh and draining)", n)
	}
	// Every node stale: no nodes.
	clock.Add(10 * time.Second)
	if _, err := d.Dispatch(Request{}); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("every node stale: err %v, want ErrNoNodes", err)
	}
}

func TestAbsurdReports(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	d, _ := newTest(t, Config{Registry: reg})
	good := func(mod func(r *buspb.LoadReport)) *buspb.LoadReport {
		r := nodeReport("x", "AS/CN/22", "unicom", 10, 1000)
		mod(r)
		return r
	}
	for _, tc := range []struct {
		name   string
		report *buspb.LoadReport
		reason string
	}{
		{"no name", good(func(r *buspb.LoadReport) { r.Node = "" }), "bad_name"},
		{"name with a dot", good(func(r *buspb.LoadReport) { r.Node = "a.b" }), "bad_name"},
		{"no ws url", good(func(r *buspb.LoadReport) { r.WsUrl = "" }), "bad_url"},
		{"http url", good(func(r *buspb.LoadReport) { r.WsUrl = "http://x/v1/ws" }), "bad_url"},
		{"bad tcp addr", good(func(r *buspb.LoadReport) { r.TcpAddr = "no-port" }), "bad_url"},
		{"negative connections", good(func(r *buspb.LoadReport) { r.Connections = -5 }), "negative"},
		{"negative capacity", good(func(r *buspb.LoadReport) { r.MaxConnections = -1 }), "negative"},
		{"negative egress", good(func(r *buspb.LoadReport) { r.EgressBytesPerSec = -1 }), "negative"},
		{"negative rtt", good(func(r *buspb.LoadReport) { r.BusRttUs = -1 }), "negative"},
		{"negative cpu", good(func(r *buspb.LoadReport) { r.Cpu = -0.5 }), "negative"},
		{"NaN cpu", good(func(r *buspb.LoadReport) { r.Cpu = math.NaN() }), "not_finite"},
		{"infinite flow control", good(func(r *buspb.LoadReport) { r.FlowControlStrength = math.Inf(1) }), "not_finite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counterValue(d.m.reports.WithLabelValues(tc.reason))
			report(d, tc.report)
			if got := counterValue(d.m.reports.WithLabelValues(tc.reason)); got != before+1 {
				t.Fatalf("reports_total{result=%q} went from %v to %v", tc.reason, before, got)
			}
			if _, err := d.Dispatch(Request{}); !errors.Is(err, ErrNoNodes) {
				t.Fatalf("a dropped report made a node: err %v", err)
			}
		})
	}
	d.onReport(&nats.Msg{Data: []byte{0xff, 0x01}})
	if got := counterValue(d.m.reports.WithLabelValues("unparseable")); got != 1 {
		t.Fatalf("unparseable reports counted %v, want 1", got)
	}

	// Capacity 0 is "not reported": the node is used with the default capacity. Out-of-range
	// fractions are clamped, and a node at full CPU is only used when nothing else is left.
	report(d, nodeReport("nocap", "", "", 10, 0))
	hot := nodeReport("hot", "", "", 0, 1000)
	hot.Cpu, hot.FlowControlStrength = 7, 3
	report(d, hot)
	got := firstChoices(t, d, Request{}, 100)
	if got["nocap"] != 100 {
		t.Fatalf("first choices %v: want the node without a capacity, not the overloaded one", got)
	}
	infos := d.Nodes(noAddr)
	if len(infos) != 2 || infos[0].Node != "hot" || !infos[0].Full || infos[0].Report.CPU != 7 ||
		infos[1].Capacity != 100_000 || infos[1].CapacityNote == "" {
		t.Fatalf("admin view %+v", infos)
	}
	report(d, nodeReport("nocap", "", "", 0, 0)) // draining the other: the hot node is the fallback
	drain := nodeReport("nocap", "", "", 0, 0)
	drain.Draining = true
	report(d, drain)
	if ans, err := d.Dispatch(Request{}); err != nil || ans.Nodes[0].Node != "hot" {
		t.Fatalf("only a full node left: %+v, %v; want it rather than nothing", ans, err)
	}
}

func TestBadRegionLabel(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	report(d, nodeReport("x", "Mars/Olympus", "unicom", 0, 0))
	infos := d.Nodes(noAddr)
	if len(infos) != 1 || infos[0].Region != "" || !strings.Contains(infos[0].RegionError, "continent") {
		t.Fatalf("admin view %+v: want the node unlabelled with the reason", infos)
	}
	if _, err := d.Dispatch(Request{}); err != nil {
		t.Fatalf("a node with a bad label still serves: %v", err)
	}
}

func TestSlowStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		slowStart time.Duration
		maxShare  float64 // of the first 10,000 clients the new node may get
	}{
		{"on", 0, 0.35},
		{"off", -1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, clock := newTest(t, Config{SlowStart: tc.slowStart})
			old := func() {
				for i := range 4 {
					report(d, nodeReport(fmt.Sprintf("old%d", i), "", "", 50_000, 100_000))
				}
			}
			old()
			keepReporting(clock, time.Minute, old) // well past the dispatcher's own start
			report(d, nodeReport("new", "", "", 0, 100_000))
			got := firstChoices(t, d, Request{}, 10_000)
			share := float64(got["new"]) / 10_000
			if tc.slowStart < 0 {
				// The contrast: without slow start the empty node takes the whole crowd.
				if share < 0.99 {
					t.Fatalf("without slow start the new node got %.2f of the crowd, want all", share)
				}
				return
			}
			if share > tc.maxShare || share < 0.05 {
				t.Fatalf("new node got %.2f of the first crowd, want some but at most %.2f", share, tc.maxShare)
			}
			// Half-way through the window it may fill half of its capacity, and takes more.
			clock.Add(15 * time.Second)
			report(d, nodeReport("new", "", "", int64(got["new"]), 100_000))
			for i := range 4 {
				report(d, nodeReport(fmt.Sprintf("old%d", i), "", "", 50_000+int64(got[fmt.Sprintf("old%d", i)]), 100_000))
			}
			later := firstChoices(t, d, Request{}, 10_000)
			if float64(later["new"])/10_000 <= share {
				t.Fatalf("new node's share did not grow: %.2f then %.2f", share, float64(later["new"])/10_000)
			}
			if infos := d.Nodes(noAddr); infos[0].Node != "new" || infos[0].SlowStartShare >= 1 {
				t.Fatalf("admin view %+v: want the new node's slow-start share below 1", infos[0])
			}
		})
	}
}

// A node back after missing its reports, or back from draining, starts slowly again.
func TestSlowStartOnReturn(t *testing.T) {
	t.Parallel()
	d, clock := newTest(t, Config{})
	a := func() { report(d, nodeReport("a", "", "", 0, 1000)) }
	a()
	keepReporting(clock, time.Minute, a)
	if s := d.Nodes(noAddr)[0].SlowStartShare; s != 1 {
		t.Fatalf("a node present at start: slow-start share %v, want 1", s)
	}
	report(d, nodeReport("a", "", "", 0, 1000))
	drain := nodeReport("a", "", "", 0, 1000)
	drain.Draining = true
	report(d, drain)
	report(d, nodeReport("a", "", "", 0, 1000))
	if s := d.Nodes(noAddr)[0].SlowStartShare; s >= 0.1 {
		t.Fatalf("back from draining: slow-start share %v, want it starting over", s)
	}
	keepReporting(clock, 31*time.Second, a)
	if s := d.Nodes(noAddr)[0].SlowStartShare; s != 1 {
		t.Fatalf("after the window: slow-start share %v, want 1", s)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	bus := &nats.Conn{}
	weights := DefaultWeights()
	weights.SameCountry = 500
	negative := DefaultWeights()
	negative.CPU = -1
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no bus", Config{}, "Bus is required"},
		{"top k", Config{Bus: bus, TopK: 17}, "TopK"},
		{"tier order", Config{Bus: bus, Weights: weights}, "same subdivision >= same country"},
		{"negative weight", Config{Bus: bus, Weights: negative}, "weights must be"},
		{"NaN near-equal", Config{Bus: bus, NearEqual: math.NaN()}, "NearEqual"},
		{"cpu full", Config{Bus: bus, CPUFull: 2}, "CPUFull"},
		{"trusted proxy", Config{Bus: bus, TrustedProxies: []string{"10.0.0.0/33"}}, "trusted proxy"},
		{"ASN in two groups", Config{Bus: bus, ISPGroups: map[string][]string{"a": {"AS1"}, "b": {"as1"}}}, "two ISP groups"},
		{"empty member", Config{Bus: bus, ISPGroups: map[string][]string{"a": {""}}}, "empty member"},
		{"group named like an ASN", Config{Bus: bus, ISPGroups: map[string][]string{"AS9": {"x"}}}, "looks like an ASN"},
		{"missing city database", Config{Bus: bus, CityDB: "testdata/nope.mmdb"}, "no such file"},
		{"missing ISP database", Config{Bus: bus, ISPDB: "testdata/nope.mmdb"}, "no such file"},
		{"corrupt database", Config{Bus: bus, CityDB: "dispatcher_test.go"}, "city database"},
		{"ISP database as city", Config{Bus: bus, CityDB: testISPDB}, "want a City or Country one"},
		{"city database as ISP", Config{Bus: bus, ISPDB: testCityDB}, "want an ISP or ASN one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.cfg)
			if err == nil {
				d.Close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

// keepReporting advances the clock by d in one-second steps, calling report after each.
func keepReporting(clock *testkit.Clock, d time.Duration, report func()) {
	for ; d > 0; d -= time.Second {
		clock.Add(min(d, time.Second))
		report()
	}
}

// The hot path's liveScore and the admin view's load must agree.
func TestLiveScoreMatchesLoad(t *testing.T) {
	t.Parallel()
	d, clock := newTest(t, Config{})
	clock.Add(time.Minute)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		r := nodeReport(fmt.Sprintf("n%d", i), "", "", rng.Int64N(2000), rng.Int64N(3)*1000)
		r.Cpu, r.FlowControlStrength, r.BusRttUs = rng.Float64()*1.1, rng.Float64()*1.1, rng.Int64N(50_000)
		if rng.IntN(2) == 0 {
			r.EgressCapacityBytesPerSec, r.EgressBytesPerSec = 1e9, rng.Int64N(1.2e9)
		}
		report(d, r)
		n := d.nodes[r.Node]
		s := n.snap.Load()
		now := d.now() + rng.Int64N(int64(40*time.Second))
		assigned := rng.Int64N(1000)
		locality := float64(rng.IntN(4) * 100)
		want := d.load(s, assigned, now).score(locality)
		if got := d.liveScore(s, assigned, now, locality); math.Abs(got-want) > 1e-6 {
			t.Fatalf("report %v, assigned %d: liveScore %v, load %v", r, assigned, got, want)
		}
	}
}

func TestConfigWithDefaults(t *testing.T) {
	bus := &nats.Conn{}
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: Config{Bus: bus}, Check: func(t *testing.T, c Config) {
			if c.StaleAfter != 3*time.Second || c.TopK != 3 || c.TTL != 30*time.Second || c.GeoCheckInterval != 10*time.Second ||
				c.NearEqual != 2 || c.SlowStart != 30*time.Second || c.CacheTTL != time.Second || c.CacheBuckets != 10_000 ||
				c.DefaultCapacity != 100_000 || c.CPUFull != 0.95 || c.LinkRTT != 20*time.Millisecond || c.Now == nil || c.Log == nil {
				t.Errorf("defaults not filled: %+v", c)
			}
			if c.Weights != DefaultWeights() || !reflect.DeepEqual(c.ISPGroups, DefaultISPGroups()) {
				t.Error("zero Weights and nil ISPGroups should mean DefaultWeights() and DefaultISPGroups()")
			}
		}},
		{Name: "never stays never", Config: Config{Bus: bus, NearEqual: -1, SlowStart: -1, CacheTTL: -1, GeoCheckInterval: -1, ISPGroups: map[string][]string{}},
			Check: func(t *testing.T, c Config) {
				if c.NearEqual != -1 || c.SlowStart != -1 || c.CacheTTL != -1 || c.GeoCheckInterval != -1 || len(c.ISPGroups) != 0 {
					t.Errorf("a negative (or empty) setting was replaced: %+v", c)
				}
			}},
		{Name: "set values are kept", Config: Config{Bus: bus, TopK: 16, CPUFull: 0.5, DefaultCapacity: 7, CacheBuckets: 9, LinkRTT: time.Second},
			Check: func(t *testing.T, c Config) {
				if c.TopK != 16 || c.CPUFull != 0.5 || c.DefaultCapacity != 7 || c.CacheBuckets != 9 || c.LinkRTT != time.Second {
					t.Errorf("set values changed: %+v", c)
				}
			}},
		{Name: "no bus", Config: Config{}, WantErr: "Bus is required"},
		{Name: "top k", Config: Config{Bus: bus, TopK: 17}, WantErr: "TopK 17 is more than 16"},
		{Name: "infinite near-equal", Config: Config{Bus: bus, NearEqual: math.Inf(-1)}, WantErr: "NearEqual must be a finite number"},
		{Name: "negative cpu full", Config: Config{Bus: bus, CPUFull: -0.1}, WantErr: "CPUFull -0.1 must be between 0 and 1"},
	})
}
