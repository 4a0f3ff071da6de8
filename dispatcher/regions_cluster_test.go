package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
)

// forwardedFor makes every request a client's behind a trusted proxy at 127.0.0.1: the
// dispatcher locates the client at ip (a MaxMind test database address).
type forwardedFor struct {
	ip   string
	base http.RoundTripper
}

func (f forwardedFor) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", f.ip)
	return f.base.RoundTrip(r)
}

// Real ChatLinks labelled with regions and an event pool, a dispatcher with MaxMind's test
// City database, and clients located through X-Forwarded-For: the two dispatcher
// checks end to end. cl-1 is in Asia, cl-2 in North America, cl-3 in Europe (Asia's near list:
// NA, then EU), cl-4 and cl-5 in Asia and the pool "finals", reserved for the dev app's room
// "finals".
//   - Logins (Go SDK, dispatched) for the finals room land on cl-4 and cl-5 only; logins for
//     other rooms never do.
//   - An Asian client is dispatched to cl-1; cl-1 drained (chatlink.Node.Drain, the drain an
//     operator's `roomcast drain` asks for), to cl-2, the nearest other region, though cl-3 is
//     as empty, and never to cl-1 nor to the pool.
func TestRegionsAndPoolOverChatLinks(t *testing.T) {
	t.Parallel()
	const asia = "175.16.199.9" // AS/CN/22 in testdata/geoip/GeoIP2-City-Test.mmdb
	labels := map[string][2]string{
		"cl-1": {"AS/CN", ""}, "cl-2": {"NA/US", ""}, "cl-3": {"EU/GB", ""},
		"cl-4": {"AS/CN", "finals"}, "cl-5": {"AS/CN", "finals"},
	}
	c := testcluster.Start(t, testcluster.ChatLinks(5), func(cfg *devcluster.Config) {
		cfg.LeaseInterval = 200 * time.Millisecond
		cfg.PerNode = func(n *chatlink.Config) { n.Region, n.Pool = labels[n.Node][0], labels[n.Node][1] }
		cfg.Dispatcher.CityDB = "../testdata/geoip/GeoIP2-City-Test.mmdb"
		cfg.Dispatcher.TrustedProxies = []string{"127.0.0.1"}
		cfg.Dispatcher.NearRegions = map[string][]string{"AS": {"NA", "EU"}}
		cfg.Dispatcher.Pools = []dispatcher.PoolReservation{{Pool: "finals", App: devcluster.App, Room: "finals"}}
		cfg.Dispatcher.SlowStart = -1
	})
	hc := &http.Client{Transport: forwardedFor{asia, http.DefaultTransport}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := c.Dispatcher.LiveNodes(); n != 5 {
			return fmt.Errorf("%d nodes live, want 5", n)
		}
		return nil
	})

	login := func(uid, room string) string {
		t.Helper()
		cl, err := sdk.Dial(ctx, sdk.Config{
			Token: testcluster.Token(t, uid, room), Dispatcher: c.URL(), HTTPClient: hc, NoReconnect: true,
		})
		if err != nil {
			t.Fatalf("%s in %s: %v", uid, room, err)
		}
		defer func() { _ = cl.Close() }()
		return cl.LoginAck().Node
	}
	for i := range 8 {
		if node := login(fmt.Sprintf("fan%d", i), "finals"); node != "cl-4" && node != "cl-5" {
			t.Fatalf("finals login %d on %s, want the pool (cl-4, cl-5)", i, node)
		}
		room := []string{"lobby", "chat"}[i%2]
		if node := login(fmt.Sprintf("u%d", i), room); node == "cl-4" || node == "cl-5" {
			t.Fatalf("%s login %d on pool node %s", room, i, node)
		}
	}

	dispatch := func() []string {
		t.Helper()
		resp, err := hc.Get(c.URL() + "/v1/dispatch")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var ans dispatcher.Answer
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, n := range ans.Nodes {
			nodes = append(nodes, n.Node)
		}
		return nodes
	}
	if got := dispatch(); got[0] != "cl-1" {
		t.Fatalf("Asian client: %v, want cl-1 (its region, outside the pool) first", got)
	}
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	defer dcancel()
	if err := c.Nodes[0].Drain(dctx, 50*time.Millisecond); err != nil {
		t.Fatalf("drain cl-1: %v", err)
	}
	// The drain reaches the dispatcher with the node's next load report, published at once.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := dispatch(); got[0] != "cl-2" {
			return fmt.Errorf("Asian client with cl-1 drained: %v, want cl-2 first", got)
		}
		return nil
	})
	for range 20 {
		got := dispatch()
		if got[0] != "cl-2" || strings.Contains(strings.Join(got, " "), "cl-1") || strings.Contains(strings.Join(got, " "), "cl-4") {
			t.Fatalf("Asian client with cl-1 drained: %v, want cl-2 (NA, nearest) first, never cl-1 nor the pool", got)
		}
	}
	if node := login("late", "lobby"); node != "cl-2" {
		t.Fatalf("login with Asia drained on %s, want cl-2", node)
	}
}
