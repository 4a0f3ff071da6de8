package dispatcher

import (
	"net/http"
	"strings"
	"testing"

	"roomcast/internal/buspb"
)

func poolNode(name, pool string, conns int64) *buspb.LoadReport {
	r := nodeReport(name, "AS/CN", "", conns, 1000)
	r.Pool = pool
	return r
}

// The issue's "an event pool: logins for the reserved room go only to the pool's ChatLinks;
// others never do": two pool nodes (emptier than the rest, so load alone would favour them)
// and three others; the finals room's clients land on the pool only, the other rooms' and the
// roomless ones never do, and a whole app reserved for a pool behaves the same.
func TestEventPool(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{CityDB: testCityDB, TrustedProxies: []string{"192.0.2.0/24"}, SlowStart: -1,
		Pools: []PoolReservation{{Pool: "finals", App: "demo", Room: "finals"}}})
	for _, r := range []*buspb.LoadReport{
		poolNode("pool-1", "finals", 0), poolNode("pool-2", "finals", 0),
		poolNode("gen-1", "", 500), poolNode("gen-2", "", 500), poolNode("gen-3", "", 500),
		poolNode("spare", "later", 0), // a pool nobody reserves: serves everyone
	} {
		report(d, r)
	}
	inPool := func(n string) bool { return strings.HasPrefix(n, "pool-") }
	// (Room affinity puts them all on one of the two: the room is far below its limit there.)
	for i := range 60 {
		_, got, _ := dispatchVia(t, d, []string{clientAS, clientEU, "10.0.0.1"}[i%3], "demo", "finals")
		if len(got) != 2 || !inPool(got[0]) || !inPool(got[1]) {
			t.Fatalf("finals client %d: %v, want the pool's two nodes only", i, got)
		}
	}
	for i := range 90 {
		app, room := "demo", []string{"lobby", "other", ""}[i%3]
		if room == "" {
			app = ""
		}
		_, got, _ := dispatchVia(t, d, clientAS, app, room)
		for _, n := range got {
			if inPool(n) {
				t.Fatalf("client %d of %s/%s: %v, includes a pool node", i, app, room, got)
			}
		}
	}
	if got := counterValue(d.m.poolDecisions.WithLabelValues("finals", "ok")); got != 60 {
		t.Fatalf("pool_decisions{finals,ok} = %v, want 60", got)
	}
	for _, info := range d.Nodes(noAddr) {
		if want := inPool(info.Node); info.Reserved != want || (want && info.Pool != "finals") {
			t.Errorf("admin view: %s pool %q reserved %v", info.Node, info.Pool, info.Reserved)
		}
	}

	// A full pool still answers with its own nodes, best first, never another.
	report(d, poolNode("pool-1", "finals", 1000))
	report(d, poolNode("pool-2", "finals", 1000))
	if _, got, _ := dispatchVia(t, d, clientAS, "demo", "finals"); len(got) != 2 || !inPool(got[0]) || !inPool(got[1]) {
		t.Fatalf("full pool: %v, want its two nodes", got)
	}
	// Drained, the pool refuses its clients rather than spill them onto the other nodes.
	for _, n := range []string{"pool-1", "pool-2"} {
		r := poolNode(n, "finals", 0)
		r.Draining = true
		report(d, r)
	}
	code, got, body := dispatchVia(t, d, clientAS, "demo", "finals")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `pool \"finals\"`) {
		t.Fatalf("pool drained: HTTP %d %v %s, want 503 naming the pool", code, got, body)
	}
	if got := counterValue(d.m.poolDecisions.WithLabelValues("finals", "no_nodes")); got != 1 {
		t.Fatalf("pool_decisions{finals,no_nodes} = %v, want 1", got)
	}
	if code, _, _ := dispatchVia(t, d, clientAS, "demo", "lobby"); code != http.StatusOK {
		t.Fatalf("other room with the pool drained: HTTP %d", code)
	}

	// Reserving a whole app, live: the pool back in service takes every room of the app; the
	// room reserved on its own keeps its pool. Released, pool nodes serve everyone.
	for _, n := range []string{"pool-1", "pool-2"} {
		report(d, poolNode(n, "finals", 0))
	}
	if err := d.SetPools([]PoolReservation{{Pool: "later", App: "vip"}, {Pool: "finals", App: "demo", Room: "finals"}}); err != nil {
		t.Fatal(err)
	}
	for _, room := range []string{"a", "b", "finals"} {
		_, got, _ := dispatchVia(t, d, clientAS, "vip", room)
		if strings.Join(got, " ") != "spare" {
			t.Fatalf("vip/%s: %v, want the later pool's only node", room, got)
		}
	}
	if _, got, _ := dispatchVia(t, d, clientAS, "demo", "lobby"); strings.Contains(strings.Join(got, " "), "spare") {
		t.Fatalf("demo/lobby: %v, includes the vip pool's node", got)
	}
	if err := d.SetPools(nil); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 40 {
		_, got, _ := dispatchVia(t, d, clientAS, "demo", "lobby")
		seen[got[0]] = true
	}
	if !seen["pool-1"] && !seen["pool-2"] && !seen["spare"] {
		t.Fatalf("reservations released: first choices %v, want the emptier former pool nodes among them", seen)
	}
}

func TestPoolReservations(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"finals=demo/finals", "vip=demo"} {
		if _, err := ParsePoolReservation(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"finals", "=demo", "finals=", "finals=demo/", "fi nals=demo", "finals=demo/a/b"} {
		if _, err := ParsePoolReservation(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
	for _, bad := range [][]PoolReservation{
		{{Pool: "p", App: "a"}, {Pool: "p", App: "b"}},                       // a pool twice
		{{Pool: "p", App: "a", Room: "r"}, {Pool: "q", App: "a", Room: "r"}}, // a room twice
		{{Pool: "p", App: "a"}, {Pool: "q", App: "a"}},                       // an app twice
		{{Pool: "p", App: "a b"}},
	} {
		if err := CheckPools(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	d, _ := newTest(t, Config{})
	if err := d.SetPools([]PoolReservation{{Pool: "p", App: "a"}, {Pool: "p", App: "b"}}); err == nil || len(d.Pools()) != 0 {
		t.Fatalf("bad reservations: %v, pools %v", err, d.Pools())
	}
	// A report with a pool label that is not a name is dropped.
	report(d, poolNode("n", "bad label", 0))
	if d.LiveNodes() != 0 {
		t.Fatal("report with a bad pool label accepted")
	}
}
