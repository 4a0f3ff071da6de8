package dispatcher

import (
	"net/netip"
	"strings"
	"testing"
)

func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted, err := parseTrustedProxies([]string{"10.0.0.0/8", "192.0.2.7", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("10.0.0.1, ", 40) + "10.0.0.2"
	for _, tc := range []struct {
		name      string
		peer      string
		forwarded []string
		realIP    string
		want      string // "" means no usable address
		source    ipSource
	}{
		{"plain peer", "203.0.113.9:5555", nil, "", "203.0.113.9", sourcePeer},
		{"IPv6 peer", "[2001:250::1]:443", nil, "", "2001:250::1", sourcePeer},
		{"peer with a zone", "[fe80::1%eth0]:80", nil, "", "fe80::1", sourcePeer},
		{"IPv4-mapped peer", "[::ffff:203.0.113.9]:1", nil, "", "203.0.113.9", sourcePeer},
		{"spoofed XFF from an untrusted peer", "203.0.113.9:1", []string{"175.16.199.1"}, "", "203.0.113.9", sourceIgnored},
		{"spoofed X-Real-IP from an untrusted peer", "203.0.113.9:1", nil, "175.16.199.1", "203.0.113.9", sourceIgnored},
		{"garbage XFF from an untrusted peer", "203.0.113.9:1", []string{"<script>"}, "", "203.0.113.9", sourceIgnored},
		{"trusted proxy", "10.1.1.1:80", []string{"175.16.199.1"}, "", "175.16.199.1", sourceForwarded},
		{"trusted single address", "192.0.2.7:80", []string{"175.16.199.1"}, "", "175.16.199.1", sourceForwarded},
		{"trusted IPv6 proxy", "[2001:db8::5]:80", []string{"2001:250::1"}, "", "2001:250::1", sourceForwarded},
		{"client-supplied entries to the left are ignored", "10.1.1.1:80", []string{"1.2.3.4, 175.16.199.1, 10.2.2.2"}, "", "175.16.199.1", sourceForwarded},
		{"several headers", "10.1.1.1:80", []string{"1.2.3.4", "175.16.199.1"}, "", "175.16.199.1", sourceForwarded},
		{"entry with a port", "10.1.1.1:80", []string{"175.16.199.1:4711"}, "", "175.16.199.1", sourceForwarded},
		{"bracketed IPv6 entry", "10.1.1.1:80", []string{"[2001:250::1]"}, "", "2001:250::1", sourceForwarded},
		{"only proxies", "10.1.1.1:80", []string{"10.3.3.3, 10.2.2.2"}, "", "10.3.3.3", sourceForwarded},
		{"unparseable XFF from a proxy", "10.1.1.1:80", []string{"175.16.199.1, not-an-ip"}, "", "", sourceInvalid},
		{"empty XFF entry", "10.1.1.1:80", []string{"175.16.199.1,,"}, "", "", sourceInvalid},
		{"too many hops", "10.1.1.1:80", []string{long}, "", "", sourceInvalid},
		{"X-Real-IP from a proxy", "10.1.1.1:80", nil, "175.16.199.1", "175.16.199.1", sourceRealIP},
		{"XFF wins over X-Real-IP", "10.1.1.1:80", []string{"81.2.69.142"}, "175.16.199.1", "81.2.69.142", sourceForwarded},
		{"bad X-Real-IP from a proxy", "10.1.1.1:80", nil, "999.1.1.1", "", sourceInvalid},
		{"proxy without headers", "10.1.1.1:80", nil, "", "10.1.1.1", sourcePeer},
		{"no peer", "", nil, "", "", sourceInvalid},
		{"peer that is not an address", "pipe", nil, "", "", sourceInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, src := trusted.ClientAddr(tc.peer, tc.forwarded, tc.realIP)
			var want netip.Addr
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got != want || src != tc.source {
				t.Fatalf("got %v (%v), want %v (%v)", got, src, want, tc.source)
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "10.0.0.0/40", "example.com", "10.0.0.1:80"} {
		if _, err := parseTrustedProxies([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p, err := parseTrustedProxies([]string{" 10.1.2.3/8 ", "::ffff:192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Contains(netip.MustParseAddr("10.200.0.1")) || !p.Contains(netip.MustParseAddr("192.0.2.1")) {
		t.Fatalf("parsed %v", p)
	}
}

func FuzzClientAddr(f *testing.F) {
	trusted, _ := parseTrustedProxies([]string{"10.0.0.0/8"})
	f.Add("10.0.0.1:80", "1.2.3.4, 10.0.0.2", "5.6.7.8")
	f.Add("[::1]:1", "[2001:db8::1]:80", "")
	f.Fuzz(func(t *testing.T, peer, forwarded, realIP string) {
		ip, src := trusted.ClientAddr(peer, []string{forwarded}, realIP)
		if src == sourceInvalid && ip.IsValid() {
			t.Fatalf("invalid source with address %v", ip)
		}
		if src != sourceInvalid && !ip.IsValid() {
			t.Fatalf("source %v without an address", src)
		}
	})
}

func TestRegionAndISPLabels(t *testing.T) {
	t.Parallel()
	in := newInterner()
	for _, tc := range []struct{ label, want, err string }{
		{"AS/CN/22", "AS/CN/22", ""},
		{"as/cn/22", "AS/CN/22", ""},
		{" EU/GB ", "EU/GB", ""},
		{"NA", "NA", ""},
		{"", "", ""},
		{"CN/22", "", "not a continent"},
		{"AS/CHN", "", "two-letter country"},
		{"AS/CN/2222", "", "subdivision code"},
		{"AS/CN/22/x", "", "more than three"},
		{"AS/C!", "", "two-letter country"},
	} {
		r, err := parseRegion(in, tc.label)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.label, err, tc.err)
			}
			continue
		}
		if err != nil || regionLabel(in, r) != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.label, regionLabel(in, r), err, tc.want)
		}
	}
	// Same subdivision code in two countries is two subdivisions.
	a, _ := parseRegion(in, "AS/CN/11")
	b, _ := parseRegion(in, "AS/KR/11")
	if a.match(b) != matchContinent {
		t.Fatalf("CN/11 vs KR/11: %v, want continent", a.match(b))
	}

	isps, err := newISPTable(DefaultISPGroups())
	if err != nil {
		t.Fatal(err)
	}
	if got := isps.nodeKeys("Unicom, AS4134 ,China Mobile Guangdong,AS4837, Some ISP"); strings.Join(got, ",") != "unicom,telecom,mobile,some isp" {
		t.Fatalf("node keys %v", got)
	}
	if a, b := isps.clientKeys(4837, "Anything"); a != "unicom" || b != "unicom" {
		t.Fatalf("client keys %q %q", a, b)
	}
	if a, b := isps.clientKeys(64512, "China Telecom Guangdong"); a != "telecom" || b != "telecom" {
		t.Fatalf("client keys %q %q", a, b)
	}
	if a, b := isps.clientKeys(64512, "Example Net"); a != "as64512" || b != "example net" {
		t.Fatalf("client keys %q %q", a, b)
	}
}
