// Package clientip finds a client's address from a connection's peer and, behind trusted
// proxies, from its forwarding headers, and matches addresses against lists of CIDRs. It is
// shared by the roles that face clients (dispatcher, ChatLink); it must not decide what an
// address is allowed to do.
package clientip

import (
	"fmt"
	"net/netip"
	"strings"
)

// Source says where a client's address came from; it labels a metric.
type Source uint8

const (
	Peer      Source = iota // the connection's peer
	Forwarded               // X-Forwarded-For from a trusted proxy
	RealIP                  // X-Real-IP from a trusted proxy
	Ignored                 // the peer is not trusted; its forwarding headers were ignored
	Invalid                 // no usable address
)

// SourceNames are the names of the sources, indexed by Source.
var SourceNames = [...]string{"peer", "forwarded", "real_ip", "ignored_headers", "invalid"}

func (s Source) String() string { return SourceNames[s] }

// maxForwardedHops bounds how many X-Forwarded-For entries are read, from the right.
const maxForwardedHops = 32

// Prefixes is a set of networks: the trusted proxies whose forwarding headers are believed,
// or an allow or deny list.
type Prefixes []netip.Prefix

// Parse reads CIDRs ("10.0.0.0/8") or single addresses ("192.0.2.7").
func Parse(list []string) (Prefixes, error) {
	var out Prefixes
	for _, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a CIDR", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Contains reports whether a is in one of the networks.
func (t Prefixes) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr picks a request's client address. peer is the connection's remote address
// ("host:port" or a bare address). Forwarding headers count only when the peer is a trusted
// proxy: then the client is the right-most X-Forwarded-For entry that is not itself a trusted
// proxy (entries to its left are whatever the client claimed), or else X-Real-IP. A forwarding
// header that does not parse makes the address unknown rather than falling back to the proxy's
// own address, which would place every client at the proxy.
func (t Prefixes) ClientAddr(peer string, forwarded []string, realIP string) (netip.Addr, Source) {
	p, ok := ParseHostAddr(peer)
	if !ok {
		return netip.Addr{}, Invalid
	}
	if !t.Contains(p) {
		if len(forwarded) > 0 || realIP != "" {
			return p, Ignored
		}
		return p, Peer
	}
	if len(forwarded) > 0 {
		hops := 0
		var leftmost netip.Addr
		for i := len(forwarded) - 1; i >= 0; i-- {
			header := forwarded[i]
			for header != "" {
				var hop string
				if j := strings.LastIndexByte(header, ','); j >= 0 {
					header, hop = header[:j], header[j+1:]
				} else {
					header, hop = "", header
				}
				if hops++; hops > maxForwardedHops {
					return netip.Addr{}, Invalid
				}
				a, ok := ParseHostAddr(strings.TrimSpace(hop))
				if !ok {
					return netip.Addr{}, Invalid
				}
				if !t.Contains(a) {
					return a, Forwarded
				}
				leftmost = a
			}
		}
		// Every hop is a trusted proxy: the first one is where the request started.
		return leftmost, Forwarded
	}
	if realIP != "" {
		if a, ok := ParseHostAddr(strings.TrimSpace(realIP)); ok {
			return a, RealIP
		}
		return netip.Addr{}, Invalid
	}
	return p, Peer
}

// ParseHostAddr reads "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" or "[::1]". Zones are dropped
// and IPv4-mapped IPv6 addresses are unmapped.
func ParseHostAddr(s string) (netip.Addr, bool) {
	if s == "" || len(s) > 64 {
		return netip.Addr{}, false
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}
