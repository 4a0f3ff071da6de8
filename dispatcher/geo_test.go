package dispatcher

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

func TestLocateWithMaxMindTestDatabases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, city, isp string
		ip              string
		region, ispKey  string
	}{
		{"city: Jilin", testCityDB, "", "175.16.199.1", "AS/CN/22", ""},
		{"city: London", testCityDB, "", "81.2.69.142", "EU/GB/ENG", ""},
		{"city: IPv6 without subdivision", testCityDB, "", "2001:250::1", "AS/CN", ""},
		{"city: IPv4-mapped IPv6", testCityDB, "", "::ffff:175.16.199.1", "AS/CN/22", ""},
		{"city: missing from the database", testCityDB, "", "1.1.1.1", "", ""},
		{"country database", testCountryDB, "", "111.235.160.1", "AS/CN", ""},
		{"ISP: Unicom by ASN and name", "", testISPDB, "27.192.0.1", "", "unicom"},
		{"ISP: Telecom", "", testISPDB, "49.64.0.1", "", "telecom"},
		{"ISP: TieTong is Mobile", "", testISPDB, "36.192.0.1", "", "mobile"},
		{"ISP: outside the table", "", testISPDB, "12.81.92.1", "", "as7018,at&t services"},
		{"ASN database", "", testASNDB, "27.192.0.1", "", "unicom"},
		{"ASN database: outside the table", "", testASNDB, "1.0.0.1", "", "as15169,google inc."},
		{"ISP: missing from the database", "", testISPDB, "175.16.199.1", "", ""},
		{"both databases, no common IP", testCityDB, testISPDB, "175.16.199.1", "AS/CN/22", ""},
		{"private address", testCityDB, testISPDB, "10.1.2.3", "", ""},
		{"loopback", testCityDB, testISPDB, "127.0.0.1", "", ""},
		{"IPv6 loopback", testCityDB, testISPDB, "::1", "", ""},
		{"link-local", testCityDB, testISPDB, "fe80::1", "", ""},
		{"unspecified", testCityDB, testISPDB, "0.0.0.0", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTest(t, Config{CityDB: tc.city, ISPDB: tc.isp})
			loc := d.locate(netip.MustParseAddr(tc.ip))
			if got := regionLabel(d.in, loc.region); got != tc.region {
				t.Errorf("region %q, want %q", got, tc.region)
			}
			if got := d.ispLabel(loc); got != tc.ispKey {
				t.Errorf("ISP %q, want %q", got, tc.ispKey)
			}
			// Twice: the second answer comes from the memo and must be the same.
			if again := d.locate(netip.MustParseAddr(tc.ip)); again != loc {
				t.Errorf("second lookup %+v, first %+v", again, loc)
			}
		})
	}
}

// The example, on a fixture where one address has both a city and an ISP: a client in
// Jilin on China Unicom gets the Jilin/Unicom node first, then same-country nodes, and never a
// farther node while a nearer one has capacity.
func TestJilinUnicomNearestFirst(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	reg := func(d *Dispatcher) {
		report(d, nodeReport("jl-unicom", "AS/CN/22", "unicom", 0, 100))
		report(d, nodeReport("bj-unicom", "AS/CN/11", "AS4837", 0, 100))
		report(d, nodeReport("sh-telecom", "AS/CN/31", "telecom", 0, 100))
		report(d, nodeReport("tokyo", "AS/JP/13", "AS2914", 0, 100))
		report(d, nodeReport("london", "EU/GB/ENG", "", 0, 100))
		report(d, nodeReport("virginia", "NA/US/VA", "", 0, 100))
	}
	client := Request{Client: netip.MustParseAddr("175.16.199.9")}

	d, _ := newTest(t, Config{CityDB: city, ISPDB: isp})
	reg(d)
	ans, err := d.Dispatch(client)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ans); got != "jl-unicom bj-unicom sh-telecom" {
		t.Fatalf("first answer %q", got)
	}
	// Fill the nodes up, one client at a time: each tier is used only once every nearer node
	// is full. The first answer above counted one client against jl-unicom already.
	want := []struct {
		node  string
		count int
	}{{"jl-unicom", 99}, {"bj-unicom", 100}, {"sh-telecom", 100}, {"tokyo", 100}}
	for _, w := range want {
		for i := range w.count {
			ans, err := d.Dispatch(client)
			if err != nil {
				t.Fatal(err)
			}
			if ans.Nodes[0].Node != w.node {
				t.Fatalf("client %d of %s's share went to %q (answer %q)", i, w.node, ans.Nodes[0].Node, names(ans))
			}
		}
	}
	// Only other continents are left, and they share the rest.
	got := map[string]int{}
	for range 200 {
		ans, _ := d.Dispatch(client)
		got[ans.Nodes[0].Node]++
	}
	if got["london"] != 100 || got["virginia"] != 100 {
		t.Fatalf("other continents: %v, want 100 each", got)
	}
	// Everything is full: the crowd still gets an answer rather than an error.
	if _, err := d.Dispatch(client); err != nil {
		t.Fatalf("every node full: %v", err)
	}

	// A Jilin client on Telecom: same province beats same ISP one tier out, which beats a
	// farther node of another ISP.
	d2, _ := newTest(t, Config{CityDB: city, ISPDB: isp})
	reg(d2)
	ans, err = d2.Dispatch(Request{Client: netip.MustParseAddr("175.16.198.1")})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ans); got != "jl-unicom sh-telecom bj-unicom" {
		t.Fatalf("Jilin Telecom client: answer %q", got)
	}
	// Tokyo's ISP (NTT) matches by ASN.
	ans, _ = d2.Dispatch(Request{Client: netip.MustParseAddr("133.0.1.1")})
	if ans.Nodes[0].Node != "tokyo" {
		t.Fatalf("Tokyo client: answer %q", names(ans))
	}
	// The admin view explains the scores.
	infos := d2.Nodes(netip.MustParseAddr("175.16.199.9"))
	if infos[0].Node != "jl-unicom" || infos[0].Match != "subdivision" || !*infos[0].SameISP ||
		infos[len(infos)-1].Match != "elsewhere" {
		t.Fatalf("admin view for a Jilin client: %+v", infos)
	}
	h := d2.Health()
	if h.Mode != ModeRegionISP || h.CityDB.Type != "GeoIP2-City" || h.ISPDB.Type != "GeoIP2-ISP" || h.Nodes != 6 {
		t.Fatalf("health %+v", h)
	}
}

func names(a Answer) string {
	var s []string
	for _, e := range a.Nodes {
		s = append(s, e.Node)
	}
	return strings.Join(s, " ")
}

// A client that cannot be located is dispatched on load alone, and counted as such.
func TestUnlocatedClients(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{CityDB: testCityDB, ISPDB: testISPDB})
	report(d, nodeReport("near", "AS/CN/22", "unicom", 900, 1000))
	report(d, nodeReport("far", "EU/GB/ENG", "", 0, 1000))
	for _, ip := range []string{"1.1.1.1", "10.0.0.1", "::1"} {
		ans, err := d.Dispatch(Request{Client: netip.MustParseAddr(ip)})
		if err != nil || ans.Nodes[0].Node != "far" {
			t.Fatalf("%s: %q %v, want the emptier node", ip, names(ans), err)
		}
	}
	if ans, _ := d.Dispatch(Request{}); ans.Nodes[0].Node != "far" {
		t.Fatalf("no address: %q, want the emptier node", names(ans))
	}
	if got := counterValue(d.m.regionMatch[matchUnknown]); got != 4 {
		t.Fatalf("region_match{match=unknown} = %v, want 4", got)
	}
	if ans, _ := d.Dispatch(Request{Client: netip.MustParseAddr("175.16.199.1")}); ans.Nodes[0].Node != "near" {
		t.Fatalf("located client: %q, want the near node", names(ans))
	}
}

func TestLoadOnlyHealth(t *testing.T) {
	t.Parallel()
	d, _ := newTest(t, Config{})
	if h := d.Health(); h.Mode != ModeLoadOnly || h.CityDB != nil || h.ISPDB != nil {
		t.Fatalf("health %+v, want load-only", h)
	}
	d2, _ := newTest(t, Config{ISPDB: testASNDB})
	if h := d2.Health(); h.Mode != ModeISP || h.ISPDB.Type != "GeoLite2-ASN" {
		t.Fatalf("health %+v, want isp mode", h)
	}
}

// copyFile replaces dst with src's bytes the way updaters do: write aside, then rename.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, data)
}

func writeFile(t *testing.T, dst string, data []byte) {
	t.Helper()
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// Reloads on file change: a new file is picked up while decisions go on, a corrupt or missing
// one leaves the previous copy in service (and says so in Health), and a fixed one is picked
// up again.
func TestReloadOnChange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fixtureCity, _ := writeFixture(t, dir)
	path := filepath.Join(dir, "city.mmdb")
	copyFile(t, fixtureCity, path)
	d, _ := newTest(t, Config{CityDB: path, GeoCheckInterval: 5 * time.Millisecond})
	report(d, nodeReport("a", "AS/CN/11", "", 0, 0))
	d.watchGeo()

	beijing := netip.MustParseAddr("123.112.0.1") // in the fixture, not in MaxMind's City test data
	region := func() string { return regionLabel(d.in, d.locate(beijing).region) }
	if got := region(); got != "AS/CN/11" {
		t.Fatalf("region %q before reload", got)
	}

	// Decisions keep flowing during every reload below.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failures []error
	var mu sync.Mutex
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := d.Dispatch(Request{Client: beijing}); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
		if len(failures) > 0 {
			t.Errorf("%d decisions failed during reloads, first: %v", len(failures), failures[0])
		}
	}()

	copyFile(t, testCityDB, path)
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := region(); got != "" {
			return fmt.Errorf("region %q: new database not loaded", got)
		}
		return nil
	})

	writeFile(t, path, []byte("this is not a database"))
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if e := d.Health().CityDB.LastError; e == "" {
			return fmt.Errorf("corrupt file not reported in health")
		}
		return nil
	})
	if got := d.Health().CityDB.Type; got != "GeoIP2-City" {
		t.Fatalf("after a corrupt file the database in service is %q", got)
	}
	if got := counterValue(d.m.geoReloads.WithLabelValues("city", "error")); got != 1 {
		t.Fatalf("geo_reloads{city,error} = %v, want 1 (a broken file is counted once)", got)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if e := d.Health().CityDB.LastError; !strings.Contains(e, "no such file") {
			return fmt.Errorf("missing file: last error %q", e)
		}
		return nil
	})

	copyFile(t, fixtureCity, path)
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got, e := region(), d.Health().CityDB.LastError; got != "AS/CN/11" || e != "" {
			return fmt.Errorf("region %q, last error %q: fixed file not loaded", got, e)
		}
		return nil
	})
}

// Not parallel: the SIGHUP goes to the whole test process.
func TestReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	fixtureCity, _ := writeFixture(t, dir)
	path := filepath.Join(dir, "city.mmdb")
	copyFile(t, fixtureCity, path)
	d, _ := newTest(t, Config{CityDB: path, GeoCheckInterval: -1, ReloadOnSIGHUP: true})
	d.watchGeo()
	beijing := netip.MustParseAddr("123.112.0.1")

	copyFile(t, testCityDB, path)
	if got := regionLabel(d.in, d.locate(beijing).region); got != "AS/CN/11" {
		t.Fatalf("without a check interval the file must not reload by itself; region %q", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := regionLabel(d.in, d.locate(beijing).region); got != "" {
			return fmt.Errorf("region %q after SIGHUP: not reloaded", got)
		}
		return nil
	})
	// Reload reports a file that does not load, and keeps the one in service.
	writeFile(t, path, []byte{0xab, 0xcd, 0xef})
	if err := d.Reload(); err == nil || d.Health().CityDB.Type != "GeoIP2-City" {
		t.Fatalf("Reload of a corrupt file: err %v, health %+v", err, d.Health().CityDB)
	}
}
