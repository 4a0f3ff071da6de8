package loadgen

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"roomcast/internal/osdep"
)

// clientsPerSourceAddr is how many clients share one loopback source address. One address
// runs out of ephemeral ports near 28,000 (net.ipv4.ip_local_port_range), and the dispatch
// requests need ports too, so stay well below.
const clientsPerSourceAddr = 10000

// dispatchConns bounds the connections to the dispatcher a fleet opens and keeps. Beyond it a
// dispatch request waits for a connection to come free rather than open another.
const dispatchConns = 256

// sourceAddr is the loopback source address of client i: 127.0.0.1 for the first
// clientsPerSourceAddr clients, then 127.0.0.2, and so on (127.0.1.1 after 127.0.0.250).
func sourceAddr(i int) net.IP {
	k := i / clientsPerSourceAddr
	return net.IPv4(127, 0, byte(k/250), byte(1+k%250))
}

// DialerFrom returns a dial function that binds to src when it dials a loopback address (with
// IP_BIND_ADDRESS_NO_PORT), and dials as usual otherwise (a remote target is reached through
// the normal route). The chaos tests' storm workers dial with it too.
func DialerFrom(src net.IP) func(ctx context.Context, network, addr string) (net.Conn, error) {
	bound := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, KeepAlive: -1, Control: bindAddressNoPort}
	plain := net.Dialer{KeepAlive: -1}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if isLoopback(addr) {
			return bound.DialContext(ctx, network, addr)
		}
		return plain.DialContext(ctx, network, addr)
	}
}

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT socket option.
const ipBindAddressNoPort = 24

// bindAddressNoPort lets the kernel choose the source port at connect(2), for the whole
// 4-tuple, instead of at bind(2), where a bind to port 0 must find a port free for every
// destination: the usual setting for many outgoing connections from one bound address.
func bindAddressNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = osdep.SetsockoptInt(fd, syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.To4() != nil && ip.IsLoopback()
}

// dispatchClient is the HTTP client a fleet's clients ask the dispatcher with. Its
// connections are kept and reused (the SDK leaves that to a client it is given): a
// connection per login would cost a connect, an accept and a close on a loopback shared with
// the server, more than the dispatch itself. Up to dispatchConns stay open between
// requests, enough for the requests in flight at thousands of logins per second; new
// connections are spread over the fleet's source addresses like the ChatLink connections.
func dispatchClient(first, count int, tlsCfg *tls.Config) *http.Client {
	var addrs []net.IP
	for i := first; i < first+count; i += clientsPerSourceAddr {
		addrs = append(addrs, sourceAddr(i))
	}
	if len(addrs) == 0 {
		addrs = append(addrs, sourceAddr(first))
	}
	dials := make([]func(context.Context, string, string) (net.Conn, error), len(addrs))
	for i, a := range addrs {
		dials[i] = DialerFrom(a)
	}
	var next atomic.Uint64
	return &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dials[next.Add(1)%uint64(len(dials))](ctx, network, addr)
			},
			MaxIdleConnsPerHost: dispatchConns,
			MaxConnsPerHost:     dispatchConns,
			IdleConnTimeout:     5 * time.Second,
			TLSClientConfig:     tlsCfg,
		},
	}
}
