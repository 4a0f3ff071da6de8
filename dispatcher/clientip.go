package dispatcher

import (
	"fmt"
	"net/netip"
	"strings"
)

// ipSource says where a client's address came from; it labels a metric.
type ipSource uint8

const (
	sourcePeer      ipSource = iota // the connection's peer
	sourceForwarded                 // X-Forwarded-For from a trusted proxy
	sourceRealIP                    // X-Real-IP from a trusted proxy
	sourceIgnored                   // the peer is not trusted; its forwarding headers were ignored
	sourceInvalid                   // no usable address: the client is dispatched on load alone
)

var sourceNames = [...]string{"peer", "forwarded", "real_ip", "ignored_headers", "invalid"}

func (s ipSource) String() string { return sourceNames[s] }

// maxForwardedHops bounds how many X-Forwarded-For entries are read, from the right.
const maxForwardedHops = 32

// trustedProxies is the set of networks whose forwarding headers are believed.
type trustedProxies []netip.Prefix

// parseTrustedProxies reads CIDRs ("10.0.0.0/8") or single addresses ("192.0.2.7").
func parseTrustedProxies(list []string) (trustedProxies, error) {
	var out trustedProxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q is neither an address nor a CIDR", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

func (t trustedProxies) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr picks a request's client address. peer is the connection's remote address
// ("host:port" or a bare address). Forwarding headers count only when the peer is a trusted
// proxy: then the client is the right-most X-Forwarded-For entry that is not itself a trusted
// proxy (entries to its left are whatever the client claimed), or else X-Real-IP. A forwarding
// header that does not parse makes the address unknown rather than falling back to the proxy's
// own address, which would place every client at the proxy.
func (t trustedProxies) clientAddr(peer string, forwarded []string, realIP string) (netip.Addr, ipSource) {
	p, ok := parseHostAddr(peer)
	if !ok {
		return netip.Addr{}, sourceInvalid
	}
	if !t.contains(p) {
		if len(forwarded) > 0 || realIP != "" {
			return p, sourceIgnored
		}
		return p, sourcePeer
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
					return netip.Addr{}, sourceInvalid
				}
				a, ok := parseHostAddr(strings.TrimSpace(hop))
				if !ok {
					return netip.Addr{}, sourceInvalid
				}
				if !t.contains(a) {
					return a, sourceForwarded
				}
				leftmost = a
			}
		}
		// Every hop is a trusted proxy: the first one is where the request started.
		return leftmost, sourceForwarded
	}
	if realIP != "" {
		if a, ok := parseHostAddr(strings.TrimSpace(realIP)); ok {
			return a, sourceRealIP
		}
		return netip.Addr{}, sourceInvalid
	}
	return p, sourcePeer
}

// parseHostAddr reads "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" or "[::1]". Zones are dropped
// and IPv4-mapped IPv6 addresses are unmapped.
func parseHostAddr(s string) (netip.Addr, bool) {
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
