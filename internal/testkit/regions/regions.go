// Package regions is the part of the test kit (internal/testkit) that stands up a wide area on
// one machine: several regions, each a NATS cluster on loopback, joined by NATS gateways into a
// supercluster, every gateway connection passing through a TCP proxy that delays it by the link's
// one-way latency (toxiproxy's latency toxic, run in-process: the kernel here has no netem) and
// that a test can cut and heal. The home region runs JetStream; the others do not, and reach it
// across their gateway (docs/regions.md). It starts NATS and proxies only: a test puts Roomcast's
// roles on top (testcluster.Regions). Only tests import it.
package regions

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"roomcast/internal/testkit"
)

// Config describes a supercluster.
type Config struct {
	// Regions names the regions. The first is the home region, the only one that runs
	// JetStream, a cluster of HomeServers servers joined by routes; each other region is a
	// cluster of one server. Required: at least two.
	Regions []string
	// HomeServers is how many servers the home region runs: JetStream's meta group, which
	// NATS will not run on one server that has gateways. Zero value means 3.
	HomeServers int
	// Delay returns the one-way latency of the link from region a to region b, added by the
	// proxies to each direction of the gateway connections between them. Zero value means 40
	// ms for every link.
	Delay func(a, b string) time.Duration
	// Log receives the NATS servers' logs (notices at debug level). Zero value means none.
	Log *slog.Logger
}

// Supercluster is a running set of regions. Its methods may be called from any goroutine.
type Supercluster struct {
	cfg     Config
	servers map[string][]*server.Server // by region
	api     *toxiproxy.ApiServer
	// links holds the proxy that a gateway connection from a region to one server of another
	// dials, by the region and the server.
	links map[link]*toxiproxy.Proxy

	mu  sync.Mutex // guards cut
	cut map[string]bool
}

// link is a gateway connection from a region to a server of another region.
type link struct {
	from, to string
	server   int // index of the server in region to
}

// deadAdvertise is what every server advertises as its gateway address. A server tells the
// gateways that connect to it its own address, and they add it to the addresses they try when
// they reconnect; advertising the real one would let a reconnect bypass the proxy (and a cut).
// Nothing listens on port 1 of loopback: a dial there is refused at once, and the reconnect
// moves on to a proxy's address.
const deadAdvertise = "127.0.0.1:1"

// Start starts the regions' NATS servers and the proxies between them, and returns once every
// server has its gateways to every other region up and JetStream has a leader. Everything
// stops when t ends.
func Start(t testing.TB, cfg Config) *Supercluster {
	t.Helper()
	if len(cfg.Regions) < 2 {
		t.Fatal("regions: a supercluster needs at least two regions")
	}
	if cfg.HomeServers <= 0 {
		cfg.HomeServers = 3
	}
	if cfg.Delay == nil {
		cfg.Delay = func(string, string) time.Duration { return 40 * time.Millisecond }
	}
	// The routes' and gateways' ports are picked before the servers bind them, and a test of
	// another package may take one in between (CI: a server "not ready"): then everything
	// stops and the supercluster starts again on other ports.
	for attempt := 1; ; attempt++ {
		s := &Supercluster{
			cfg:     cfg,
			servers: make(map[string][]*server.Server),
			api:     toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
			links:   make(map[link]*toxiproxy.Proxy),
			cut:     make(map[string]bool),
		}
		// Before the cleanup that stops the servers: cleanups run last first, and the
		// servers must stop before their store goes.
		storeDir := t.TempDir()
		err := s.start(t, storeDir)
		if err == nil {
			t.Cleanup(s.close)
			started := time.Now()
			testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, s.ready)
			t.Logf("ready after %v", time.Since(started))
			return s
		}
		s.close()
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			t.Fatalf("regions: %v", err)
		}
		t.Logf("regions: attempt %d: %v; again on other ports", attempt, err)
	}
}

// start starts the proxies and the servers, and returns once every server listens; an error
// names a server that does not, and why.
func (s *Supercluster) start(t testing.TB, storeDir string) error {
	t.Helper()
	cfg := s.cfg
	// Every address first: a server's options name its peers' and the proxies'.
	gatewayAddr := make(map[string][]string)
	var routes []*url.URL // the home region's cluster ports
	for i, r := range cfg.Regions {
		n := 1
		if i == 0 {
			n = cfg.HomeServers
			for range n {
				routes = append(routes, &url.URL{Scheme: "nats", Host: testkit.FreeAddr(t)})
			}
		}
		for range n {
			gatewayAddr[r] = append(gatewayAddr[r], testkit.FreeAddr(t))
		}
	}
	for _, from := range cfg.Regions {
		for _, to := range cfg.Regions {
			if from == to {
				continue
			}
			for i, upstream := range gatewayAddr[to] {
				p := toxiproxy.NewProxy(s.api, fmt.Sprintf("%s-%s%d", from, to, i), "127.0.0.1:0", upstream)
				if err := p.Start(); err != nil {
					return fmt.Errorf("proxy %s->%s: %v", from, to, err)
				}
				// Only from's servers may dial it (gatewayFromToxic), first in the upstream chain.
				check := fmt.Sprintf(`{"type":"gateway_from","stream":"upstream","attributes":{"gateway":%q}}`, from)
				if _, err := p.Toxics.AddToxicJson(strings.NewReader(check)); err != nil {
					return fmt.Errorf("gateway check on %s->%s: %v", from, to, err)
				}
				// Upstream is what from sends to, downstream what comes back on the connection.
				for _, d := range []struct {
					stream string
					delay  time.Duration
				}{{"upstream", cfg.Delay(from, to)}, {"downstream", cfg.Delay(to, from)}} {
					toxic := fmt.Sprintf(`{"type":"latency","stream":%q,"attributes":{"latency":%d}}`, d.stream, d.delay.Milliseconds())
					if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
						return fmt.Errorf("latency on %s->%s: %v", from, to, err)
					}
				}
				s.links[link{from, to, i}] = p
			}
		}
	}
	for ri, r := range cfg.Regions {
		for i, gw := range gatewayAddr[r] {
			host, port := splitAddr(t, gw)
			opts := &server.Options{
				ServerName: fmt.Sprintf("nats-%s-%d", r, i+1),
				Host:       "127.0.0.1",
				Port:       server.RANDOM_PORT,
				NoSigs:     true,
				NoLog:      cfg.Log == nil,
				MaxPayload: 1 << 20,
				Cluster:    server.ClusterOpts{Name: r, Host: "127.0.0.1", Port: server.RANDOM_PORT},
				Gateway:    server.GatewayOpts{Name: r, Host: host, Port: port, Advertise: deadAdvertise},
			}
			if ri == 0 {
				opts.Cluster.Host, opts.Cluster.Port = splitAddr(t, routes[i].Host)
				opts.Routes = routes
				opts.JetStream, opts.StoreDir = true, filepath.Join(storeDir, opts.ServerName)
			}
			for _, to := range cfg.Regions {
				if to == r {
					continue
				}
				remote := &server.RemoteGatewayOpts{Name: to}
				for j := range gatewayAddr[to] {
					remote.URLs = append(remote.URLs, &url.URL{Scheme: "nats", Host: s.links[link{r, to, j}].Listen})
				}
				opts.Gateway.Gateways = append(opts.Gateway.Gateways, remote)
			}
			ns, err := server.NewServer(opts)
			if err != nil {
				return fmt.Errorf("server of %s: %v", r, err)
			}
			if cfg.Log != nil {
				ns.SetLoggerV2(&natsLogger{cfg.Log.With("server", opts.ServerName)}, false, false, false)
			}
			go ns.Start()
			s.servers[r] = append(s.servers[r], ns)
		}
	}
	for _, r := range cfg.Regions {
		for _, ns := range s.servers[r] {
			if !ns.ReadyForConnections(20 * time.Second) {
				// Healthz names why: a port it could not bind, say.
				return fmt.Errorf("server %s not ready in 20s: %s", ns.Name(), ns.Healthz(nil).Error)
			}
		}
	}
	return nil
}

// ready returns nil when every server has an outbound gateway connection to every other
// region, every region has an inbound one from each server of the others, and JetStream has
// a leader.
func (s *Supercluster) ready() error {
	inbound := make(map[string]int) // region -> inbound gateway connections of its servers
	for _, r := range s.cfg.Regions {
		for _, ns := range s.servers[r] {
			gz, err := ns.Gatewayz(nil)
			if err != nil {
				return err
			}
			if out := countOpen(gz.OutboundGateways); out < len(s.cfg.Regions)-1 {
				return fmt.Errorf("server %s: %d outbound gateways, want %d", ns.Name(), out, len(s.cfg.Regions)-1)
			}
			for _, in := range gz.InboundGateways {
				inbound[r] += len(in)
			}
		}
	}
	total := 0
	for _, r := range s.cfg.Regions {
		total += len(s.servers[r])
	}
	for _, r := range s.cfg.Regions {
		if want := total - len(s.servers[r]); inbound[r] < want {
			return fmt.Errorf("region %s: %d inbound gateways, want %d", r, inbound[r], want)
		}
	}
	for _, ns := range s.servers[s.Home()] {
		if ns.JetStreamIsLeader() {
			return nil
		}
	}
	return errors.New("JetStream has no leader yet")
}

// countOpen counts the outbound gateways that have a connection.
func countOpen(out map[string]*server.RemoteGatewayz) int {
	n := 0
	for _, g := range out {
		if g.Connection != nil {
			n++
		}
	}
	return n
}

// Home returns the home region: the first, the one with JetStream.
func (s *Supercluster) Home() string { return s.cfg.Regions[0] }

// Regions returns the regions' names, the home region first.
func (s *Supercluster) Regions() []string { return s.cfg.Regions }

// Servers returns region r's NATS servers.
func (s *Supercluster) Servers(r string) []*server.Server { return s.servers[r] }

// URL returns the client URLs of region r's NATS servers, comma-separated.
func (s *Supercluster) URL(r string) string {
	var urls []string
	for _, ns := range s.servers[r] {
		urls = append(urls, ns.ClientURL())
	}
	return strings.Join(urls, ",")
}

// Delay returns the one-way latency the proxies add from region a to region b.
func (s *Supercluster) Delay(a, b string) time.Duration { return s.cfg.Delay(a, b) }

// GatewayStats is what a server's gateway connection to another region has carried, as NATS
// counts it (Server.Gatewayz, the /gatewayz monitoring endpoint).
type GatewayStats struct {
	// Msgs and Bytes went from the server to the other region on its outbound gateway
	// connection, the one that carries its messages there.
	Msgs, Bytes int64
}

// Gateway returns what region from's servers have sent to region to over their gateway
// connections. The counts are the current connections': a connection that was cut and made
// again starts from zero.
func (s *Supercluster) Gateway(from, to string) (GatewayStats, error) {
	var st GatewayStats
	for _, ns := range s.servers[from] {
		gz, err := ns.Gatewayz(&server.GatewayzOptions{Name: to})
		if err != nil {
			return GatewayStats{}, err
		}
		out := gz.OutboundGateways[to]
		if out == nil || out.Connection == nil {
			return GatewayStats{}, fmt.Errorf("regions: %s has no gateway connection to %s", ns.Name(), to)
		}
		st.Msgs += out.Connection.OutMsgs
		st.Bytes += out.Connection.OutBytes
	}
	return st, nil
}

// Cut breaks every gateway connection between region r and the others: the proxies close
// the connections and refuse new ones until Heal, so the servers see their peers gone (as at a
// link failure that resets connections, not one that drops packets silently) and keep trying
// to reconnect, in vain both ways: a proxy lets through only its own region's servers
// (gatewayFromToxic). Clients of r's server stay connected to it.
func (s *Supercluster) Cut(r string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, p := range s.links {
		if l.from == r || l.to == r {
			p.Stop()
		}
	}
	s.cut[r] = true
	return nil
}

// Heal lets region r's gateway connections through again; the servers reconnect on their own
// (NATS retries a configured gateway every second or so). It returns once every gateway is up.
func (s *Supercluster) Heal(r string) error {
	s.mu.Lock()
	for l, p := range s.links {
		if (l.from == r || l.to == r) && !s.cut[l.other(r)] {
			// Listen holds the address the proxy bound first: it takes the same port again.
			if err := p.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
				s.mu.Unlock()
				return fmt.Errorf("regions: restart proxy %s->%s: %w", l.from, l.to, err)
			}
		}
	}
	delete(s.cut, r)
	s.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("regions: after healing %s: %w", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// other returns the end of l that is not r.
func (l link) other(r string) string {
	if l.from == r {
		return l.to
	}
	return l.from
}

func (s *Supercluster) close() {
	for _, servers := range s.servers {
		for _, ns := range servers {
			ns.Shutdown()
		}
	}
	for _, servers := range s.servers {
		for _, ns := range servers {
			ns.WaitForShutdown()
		}
	}
	for _, p := range s.links {
		p.Stop()
	}
}

func splitAddr(t testing.TB, addr string) (string, int) {
	t.Helper()
	tcp, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return tcp.IP.String(), tcp.Port
}

// natsLogger adapts slog to the NATS server's logger.
type natsLogger struct{ log *slog.Logger }

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any)  {}
