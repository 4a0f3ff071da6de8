package dispatcher

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
)

// MaxMind's test databases, copied from the shared test data (see testdata/geoip/README.md).
const (
	testCityDB    = "../testdata/geoip/GeoIP2-City-Test.mmdb"
	testCountryDB = "../testdata/geoip/GeoIP2-Country-Test.mmdb"
	testISPDB     = "../testdata/geoip/GeoIP2-ISP-Test.mmdb"
	testASNDB     = "../testdata/geoip/GeoLite2-ASN-Test.mmdb"
)

var noAddr netip.Addr

// newTest returns a dispatcher on a fake clock and a bus it never uses: tests feed it reports
// with report(). cfg.Bus and cfg.Now are filled in.
func newTest(t testing.TB, cfg Config) (*Dispatcher, *testkit.Clock) {
	t.Helper()
	clock := testkit.NewClock(time.Unix(1_700_000_000, 0))
	cfg.Bus = &nats.Conn{}
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, clock
}

// report delivers a load report the way NATS would.
func report(d *Dispatcher, r *buspb.LoadReport) {
	b, err := proto.Marshal(r)
	if err != nil {
		panic(err)
	}
	d.onReport(&nats.Msg{Data: b})
}

// node is a load report for a node named name, reachable at ws://name.test/v1/ws.
func nodeReport(name, region, isp string, conns, capacity int64) *buspb.LoadReport {
	return &buspb.LoadReport{
		Node: name, WsUrl: "ws://" + name + ".test/v1/ws", TcpAddr: name + ".test:9000",
		Region: region, Isp: isp, Connections: conns, MaxConnections: capacity,
	}
}

// Fixture networks: where one address needs both a region and an ISP, which MaxMind's test
// databases never give together.
var fixture = []struct {
	cidr, continent, country, subdivision string
	isp                                   string
	asn                                   uint32
}{
	{"175.16.199.0/24", "AS", "CN", "22", "China Unicom Jilin", 4837},    // Jilin, Unicom
	{"175.16.198.0/24", "AS", "CN", "22", "China Telecom Jilin", 4134},   // Jilin, Telecom
	{"123.112.0.0/16", "AS", "CN", "11", "China Unicom Beijing", 4837},   // Beijing, Unicom
	{"180.160.0.0/16", "AS", "CN", "31", "China Telecom Shanghai", 4134}, // Shanghai, Telecom
	{"133.0.0.0/16", "AS", "JP", "13", "NTT", 2914},                      // Tokyo
	{"81.2.0.0/16", "EU", "GB", "ENG", "BT", 2856},                       // England
}

// writeFixture builds a City and an ISP database from fixture with mmdbwriter and returns their
// paths.
func writeFixture(t testing.TB, dir string) (city, isp string) {
	t.Helper()
	cityTree, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "GeoIP2-City", RecordSize: 28})
	if err != nil {
		t.Fatal(err)
	}
	ispTree, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "GeoIP2-ISP", RecordSize: 28})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fixture {
		_, network, err := net.ParseCIDR(f.cidr)
		if err != nil {
			t.Fatal(err)
		}
		err = cityTree.Insert(network, mmdbtype.Map{
			"continent": mmdbtype.Map{"code": mmdbtype.String(f.continent)},
			"country":   mmdbtype.Map{"iso_code": mmdbtype.String(f.country)},
			"subdivisions": mmdbtype.Slice{
				mmdbtype.Map{"iso_code": mmdbtype.String(f.subdivision)},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		err = ispTree.Insert(network, mmdbtype.Map{
			"isp":                            mmdbtype.String(f.isp),
			"organization":                   mmdbtype.String(f.isp),
			"autonomous_system_number":       mmdbtype.Uint32(f.asn),
			"autonomous_system_organization": mmdbtype.String(f.isp),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	city, isp = filepath.Join(dir, "fixture-city.mmdb"), filepath.Join(dir, "fixture-isp.mmdb")
	for path, tree := range map[string]*mmdbwriter.Tree{city: cityTree, isp: ispTree} {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tree.WriteTo(f); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return city, isp
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
