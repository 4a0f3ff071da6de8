package dispatcher

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"roomcast/internal/buspb"
)

// Clients of MaxMind's test City database (testdata/geoip/README.md), in three regions.
const (
	clientAS = "175.16.199.9" // AS/CN/22, Jilin
	clientEU = "81.2.69.142"  // EU/GB/ENG, England
	clientNA = "214.78.120.1" // NA/US/CA, California
)

// dispatchVia asks d over HTTP for a client behind a trusted proxy (X-Forwarded-For), for a
// room, and returns the HTTP status and the answer's node names.
func dispatchVia(t *testing.T, d *Dispatcher, client, app, room string) (int, []string, string) {
	t.Helper()
	q := ""
	if app != "" {
		q = "?app=" + app + "&room=" + room
	}
	req := httptest.NewRequest("GET", "/v1/dispatch"+q, nil)
	req.RemoteAddr = "192.0.2.10:443"
	req.Header.Set("X-Forwarded-For", client)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, nil, strings.TrimSpace(rec.Body.String())
	}
	var nodes []string
	for _, part := range strings.Split(rec.Body.String(), `"node":"`)[1:] {
		nodes = append(nodes, part[:strings.IndexByte(part, '"')])
	}
	return rec.Code, nodes, ""
}

// The issue's "a client located in region B is dispatched to B's ChatLinks; with B's ChatLinks
// drained, to the nearest other region": three regions on three continents, the client in
// Asia, whose near list says North America, then Europe. Europe's node is the emptier, so
// without the list (or once the list is set aside) load alone would pick it.
func TestRegionFallbackAfterDrain(t *testing.T) {
	t.Parallel()
	regions := func(d *Dispatcher, drainAS bool) {
		for _, n := range []*buspb.LoadReport{
			nodeReport("as-1", "AS/CN", "", 100, 1000),
			nodeReport("as-2", "AS/CN", "", 100, 1000),
			nodeReport("na-1", "NA/US", "", 600, 1000),
			nodeReport("eu-1", "EU/GB", "", 0, 1000),
		} {
			n.Draining = drainAS && strings.HasPrefix(n.Node, "as-")
			report(d, n)
		}
	}
	cfg := Config{CityDB: testCityDB, TrustedProxies: []string{"192.0.2.0/24"}, SlowStart: -1, NearEqual: -1,
		NearRegions: map[string][]string{"AS": {"NA", "EU"}, "EU": {"NA", "AS"}}}
	d, _ := newTest(t, cfg)
	regions(d, false)

	// In its own region first, whatever the other regions' load; the near list orders the rest.
	for range 20 {
		_, got, _ := dispatchVia(t, d, clientAS, "", "")
		if len(got) != 3 || !strings.HasPrefix(got[0], "as-") || !strings.HasPrefix(got[1], "as-") || got[2] != "na-1" {
			t.Fatalf("Asian client: %v, want as-1 and as-2, then na-1", got)
		}
	}
	// A client of another region gets its own.
	if _, got, _ := dispatchVia(t, d, clientEU, "", ""); got[0] != "eu-1" || got[1] != "na-1" {
		t.Fatalf("European client: %v, want eu-1, then na-1 (its list: NA, AS)", got)
	}

	// Drain Asia's nodes (their reports say so, as a draining ChatLink's does): the Asian
	// client goes to the nearest other region, North America, busier as it is, then Europe,
	// and never to a drained node.
	regions(d, true)
	for range 20 {
		_, got, _ := dispatchVia(t, d, clientAS, "", "")
		if strings.Join(got, " ") != "na-1 eu-1" {
			t.Fatalf("Asian client with Asia drained: %v, want na-1 then eu-1", got)
		}
	}
	if got := counterValue(d.m.regionMatch[matchNear]); got != 20 {
		t.Fatalf("region_match{match=near} = %v, want 20", got)
	}
	// The admin view shows the match for the client.
	for _, info := range d.Nodes(mustAddr(clientAS)) {
		want := map[string]string{"na-1": "near", "eu-1": "near", "as-1": "country", "as-2": "country"}[info.Node]
		if info.Match != want {
			t.Errorf("admin view: %s match %q, want %q", info.Node, info.Match, want)
		}
	}

	// Without a near list the other continents are equally far: the emptier, Europe, wins.
	plain, _ := newTest(t, Config{CityDB: testCityDB, TrustedProxies: []string{"192.0.2.0/24"}, SlowStart: -1, NearEqual: -1})
	regions(plain, true)
	if _, got, _ := dispatchVia(t, plain, clientAS, "", ""); strings.Join(got, " ") != "eu-1 na-1" {
		t.Fatalf("no near list, Asia drained: %v, want eu-1 (emptier) then na-1", got)
	}

	// A region on the list whose nodes are all full ranks below one with room, as any full
	// node does; a client of a region without a list (America) ranks the others by load.
	full := nodeReport("na-1", "NA/US", "", 1000, 1000)
	report(d, full)
	if _, got, _ := dispatchVia(t, d, clientAS, "", ""); strings.Join(got, " ") != "eu-1 na-1" {
		t.Fatalf("Asia drained, America full: %v, want eu-1 then na-1", got)
	}
	if _, got, _ := dispatchVia(t, d, clientNA, "", ""); got[0] != "na-1" && got[0] != "eu-1" {
		t.Fatalf("American client: %v", got)
	}
}

// The most specific key wins, and the table refuses what it cannot mean.
func TestNearRegionsTable(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{CityDB: testCityDB, NearRegions: map[string][]string{
		"AS": {"EU"}, "AS/CN/22": {"NA/US/CA", "OC"},
	}})
	if l := d.locate(mustAddr(clientAS)).near; l == nil || l.key != "AS/CN/22" {
		t.Fatalf("Jilin's near list %+v, want the AS/CN/22 key's", l)
	}
	if l := d.locate(mustAddr("2001:250::1")).near; l == nil || l.key != "AS" {
		t.Fatalf("China without a subdivision: near list %+v, want the AS key's", l)
	}
	if l := d.locate(mustAddr(clientEU)).near; l != nil {
		t.Fatalf("England: near list %+v, want none", l)
	}
	for _, bad := range []map[string][]string{
		{"AS": {"AS/JP"}},         // same continent
		{"XX": {"EU"}},            // not a region
		{"AS": {"EU", "eu"}},      // twice
		{"AS": {}},                // empty
		{"AS": {"EU/GB/ENG/LDN"}}, // four parts
		{"AS": {"EU", "NA", "SA", "AF", "OC", "AN", "EU/GB", "EU/FR", "EU/DE"}}, // more than 8
	} {
		if _, err := New(Config{Bus: d.cfg.Bus, NearRegions: bad}); err == nil {
			t.Errorf("NearRegions %v: no error", bad)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
