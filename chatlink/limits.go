package chatlink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/clientip"
	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
	"roomcast/store/applimits"
)

// Limits are the rates and counts a ChatLink holds its clients to (docs/security.md). A zero
// field means DefaultLimits' value, the deployment's default; ratelimit.Unlimited, or a
// negative ConnectionsPerIP or LoginConcurrency, limits nothing. IPv6 addresses are counted by
// their /64, which one subscriber usually holds whole; loopback addresses are not counted.
type Limits struct {
	// LoginsPerIP, LoginsPerApp and JoinsPerRoom bound logins from one address, into one app
	// and into one room on this node; a login over one is refused with Error 121 and Kick 4013.
	LoginsPerIP, LoginsPerApp, JoinsPerRoom ratelimit.Limit
	// SendsPerConn, SendsPerUser and SendsPerRoom bound Sends of one connection, of one user
	// (all its connections on this node) and into one room from this node; a Send over one
	// is refused with Error 120 and a retry hint.
	SendsPerConn, SendsPerUser, SendsPerRoom ratelimit.Limit
	// ConnectionsPerIP bounds the connections open from one address.
	ConnectionsPerIP int
	// LoginRate paces the logins the node processes, from every address together: a login
	// with no token waits for one, so a reconnect storm is spread over seconds and the
	// members already on the node keep their fan-out (loginpace.go).
	LoginRate ratelimit.Limit
	// LoginQueue bounds the logins waiting for LoginRate; one more is refused with Error 121
	// and Kick 4013, retry_after_ms the time the queue takes to drain. Zero value means three
	// seconds of LoginRate.
	LoginQueue int
	// LoginConcurrency bounds the logins past LoginRate at once (their requests to the
	// services, their join): one more waits, in arrival order, for one of them to finish.
	LoginConcurrency int
	// TableSize bounds the keys (addresses, users, rooms) each limit remembers.
	TableSize int
}

// DefaultLimits returns the deployment's limits: what a zero Limits field means, and the
// defaults of `roomcast chatlink`'s and `roomcast dev`'s flags. A refused client waits the
// server's hint and comes back (the SDKs and the load generator do), so a limit delays a crowd
// rather than losing it; still, they are sized so that a big event does not meet them at all
// (docs/security.md):
//   - joins per room: a 60,000-member room joining over a minute is 1,000/s on average, in
//     bursts; 2,000/s with a burst of 10,000 lets that in without a refusal.
//   - logins and connections per address: carrier-grade NAT puts hundreds to thousands of
//     mobile subscribers behind one public address, so the limits are a multiple of what one
//     device needs: 50 logins/s with a burst of 500, and 5,000 connections. They stop one
//     source from holding a node, not a shared address from watching.
//   - sends per connection and per user: 20/s (bursts of 40) and 40/s (bursts of 80), more
//     than a person types or taps; the room service caps a room's members together too.
//   - logins per node (LoginRate): not a refusal but a pace, logins over it wait their turn
//     (docs/edge.md). A TCP login that recovers its room's history costs the node 0.14-0.19
//     ms of CPU, a WebSocket one through the dispatcher up to 0.43 ms: 3,000/s is at most
//     0.4-1.3 cores, and 15,000 clients of a dead node are in within about 5 s.
//   - logins in progress per node (LoginConcurrency): 64. It keeps a reconnect storm on a
//     CPU-starved node from holding its members' messages, and a dead node's 2,000 WebSocket
//     clients still come back through the dispatcher in 2.1-2.5 s, now that a room's
//     recoveries share their history reads (docs/reliability.md).
//   - logins per app and sends per room from a node: none (an app's own limits may set them).
func DefaultLimits() Limits {
	return Limits{
		LoginsPerIP:      ratelimit.Limit{Rate: 50, Burst: 500},
		LoginsPerApp:     ratelimit.Unlimited,
		JoinsPerRoom:     ratelimit.Limit{Rate: 2000, Burst: 10000},
		SendsPerConn:     ratelimit.Limit{Rate: 20, Burst: 40},
		SendsPerUser:     ratelimit.Limit{Rate: 40, Burst: 80},
		SendsPerRoom:     ratelimit.Unlimited,
		ConnectionsPerIP: 5000,
		LoginRate:        ratelimit.Limit{Rate: 3000, Burst: 300},
		LoginConcurrency: 64,
		TableSize:        65536,
	}
}

// withDefaults returns l with each zero field set to DefaultLimits'.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	for _, f := range []struct{ l, d *ratelimit.Limit }{
		{&l.LoginsPerIP, &d.LoginsPerIP}, {&l.LoginsPerApp, &d.LoginsPerApp}, {&l.JoinsPerRoom, &d.JoinsPerRoom},
		{&l.SendsPerConn, &d.SendsPerConn}, {&l.SendsPerUser, &d.SendsPerUser}, {&l.SendsPerRoom, &d.SendsPerRoom},
		{&l.LoginRate, &d.LoginRate},
	} {
		if *f.l == (ratelimit.Limit{}) {
			*f.l = *f.d
		}
	}
	if l.ConnectionsPerIP == 0 {
		l.ConnectionsPerIP = d.ConnectionsPerIP
	}
	if l.LoginConcurrency == 0 {
		l.LoginConcurrency = d.LoginConcurrency
	}
	if l.TableSize <= 0 {
		l.TableSize = d.TableSize
	}
	return l
}

// Names of the limits, labelling roomcast_chatlink_limited_total.
const (
	limitLoginIP     = "login_ip"
	limitLoginApp    = "login_app"
	limitJoinRoom    = "join_room"
	limitSendConn    = "send_conn"
	limitSendUser    = "send_user"
	limitSendRoom    = "send_room"
	limitConnsIP     = "connections_ip"
	limitDeniedIP    = "denied_ip"
	limitDeniedAppIP = "denied_ip_app"
	ipListInterval   = time.Second // how often the IP list file is looked at
	// connsRetryHint is the retry hint of a refusal for too many connections from one
	// address (Kick 4015's retry_after_ms, HTTP Retry-After): unlike a rate, an open count
	// says nothing about when a connection will close, so the hint is a fixed, short wait
	// that the client's jitter spreads out.
	connsRetryHint = 2 * time.Second
)

type (
	userKey struct{ app, uid string }
	roomKey struct{ app, room string }
)

// limiter holds the node's rate tables and its per-address connection counts.
type limiter struct {
	cfg        Limits
	trusted    clientip.Prefixes
	limited    *prometheus.CounterVec // by limit name
	handshakes *prometheus.CounterVec // failed, by handshake (tls, websocket) and reason (timeout, bad)
	reloads    *prometheus.CounterVec // IP list file reads after a change or SIGHUP, by result (ok, error)
	logins     *ratelimit.Table[netip.Addr]
	appLogins  *ratelimit.Table[string]
	apps       *applimits.Watcher // the apps' own limits and lists; nil until the node starts
	joins      *ratelimit.Table[roomKey]
	users      *ratelimit.Table[userKey]
	rooms      *ratelimit.Table[roomKey]
	lists      atomic.Pointer[applimits.Parsed] // the node's address lists (its Allow and Deny)
	sampled    *ratelimit.Table[string]         // attack logs by message: about one a second of each
	mu         sync.Mutex                       // guards open
	open       map[netip.Addr]int
	// The list file as last looked at, parsed or not, so that a file is read (and a bad one
	// reported) once per change; touched by newLimiter, then only by the reload loop.
	listMod  time.Time
	listSize int64
	listErr  string // why the last look failed; "" when it did not
}

func newLimiter(cfg Config) (*limiter, error) {
	trusted, err := clientip.Parse(cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("chatlink: trusted proxy: %w", err)
	}
	lim := cfg.Limits.withDefaults() // New has; a test's limiter may not
	size := lim.TableSize
	l := &limiter{
		cfg: lim, trusted: trusted,
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_limited_total",
			Help: "Connections, logins and sends refused by a limit or an address list, by limit.",
		}, []string{"limit"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_handshakes_failed_total",
			Help: "TLS and WebSocket handshakes that failed, by handshake and reason (timeout: never finished).",
		}, []string{"handshake", "reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_ip_list_reloads_total",
			Help: "Reads of the --ip-list file after it changed or on SIGHUP, by result: ok, or error (the lists in force stay).",
		}, []string{"result"}),
		logins: ratelimit.NewTable[netip.Addr](size), appLogins: ratelimit.NewTable[string](size),
		joins: ratelimit.NewTable[roomKey](size), users: ratelimit.NewTable[userKey](size),
		rooms: ratelimit.NewTable[roomKey](size), open: make(map[netip.Addr]int),
		sampled: ratelimit.NewTable[string](16),
	}
	l.lists.Store(&applimits.Parsed{})
	if cfg.IPListFile != "" {
		if _, err := l.reloadIPList(cfg.IPListFile, true); err != nil {
			return nil, fmt.Errorf("chatlink: %w", err)
		}
	}
	return l, nil
}

// perAddress says whether the per-address limits apply to a: not to an unknown address, nor
// to loopback, where a local proxy or load generator stands for many clients.
func perAddress(a netip.Addr) bool { return a.IsValid() && !a.IsLoopback() }

// subscriber returns the key an address is counted under: itself, or its /64 for IPv6.
func subscriber(a netip.Addr) netip.Addr {
	if a.Is6() && !a.Is4In6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// clientAddr is the address of a client connecting from peer, with the forwarding headers
// of a trusted proxy (WebSocket and the HTTP fallback); invalid when none can be found.
func (l *limiter) clientAddr(peer string, forwarded []string, realIP string) netip.Addr {
	a, _ := l.trusted.ClientAddr(peer, forwarded, realIP)
	return a
}

// admit says whether a new connection from a may open: 0 when it may, else the close code.
// A connection it lets in is counted from then on, before any answer lets the client open its
// next one; closed gives the count back, when the connection ends or its handshake fails.
func (l *limiter) admit(a netip.Addr) clientpb.CloseCode {
	if !l.lists.Load().Allows(a) {
		l.limited.WithLabelValues(limitDeniedIP).Inc()
		return clientpb.CloseCode_CLOSE_CODE_ADDRESS_DENIED
	}
	if max := l.cfg.ConnectionsPerIP; max > 0 && perAddress(a) {
		k := subscriber(a)
		l.mu.Lock()
		full := l.open[k] >= max
		if !full {
			l.open[k]++
		}
		l.mu.Unlock()
		if full {
			l.limited.WithLabelValues(limitConnsIP).Inc()
			return clientpb.CloseCode_CLOSE_CODE_TOO_MANY_CONNECTIONS
		}
	}
	return 0
}

// closed gives back the count admit took for a connection of a.
func (l *limiter) closed(a netip.Addr) {
	if l.cfg.ConnectionsPerIP > 0 && perAddress(a) {
		k := subscriber(a)
		l.mu.Lock()
		if l.open[k]--; l.open[k] <= 0 {
			delete(l.open, k)
		}
		l.mu.Unlock()
	}
}

// loginAddr checks a login from a against the per-address rate.
func (l *limiter) loginAddr(a netip.Addr, now time.Time) (string, time.Duration) {
	if perAddress(a) {
		if ok, retry := l.logins.Take(subscriber(a), l.cfg.LoginsPerIP, now); !ok {
			return limitLoginIP, retry
		}
	}
	return "", 0
}

// appAllows says whether app's own address lists let a login from a in.
func (l *limiter) appAllows(app string, a netip.Addr) bool {
	if l.apps.App(app).Allows(a) {
		return true
	}
	l.limited.WithLabelValues(limitDeniedAppIP).Inc()
	return false
}

// loginRoom checks a verified login against its app's and room's rates; an app's own limits
// (SetAppLimits) replace the node's.
func (l *limiter) loginRoom(app, room string, now time.Time) (string, time.Duration) {
	logins, joins := l.cfg.LoginsPerApp, l.cfg.JoinsPerRoom
	if own := l.apps.App(app); own != nil {
		logins, joins = applimits.Or(own.LoginsPerApp, logins), applimits.Or(own.JoinsPerRoom, joins)
	}
	if ok, retry := l.appLogins.Take(app, logins, now); !ok {
		return limitLoginApp, retry
	}
	if ok, retry := l.joins.Take(roomKey{app, room}, joins, now); !ok {
		return limitJoinRoom, retry
	}
	return "", 0
}

// send checks a Send of c against the connection's, user's and room's rates. Caller holds c.mu.
func (l *limiter) send(c *conn, now time.Time) (string, time.Duration) {
	own := l.apps.App(c.app)
	if own == nil { // the usual case: the node's limits
		return l.sendWith(c, now, l.cfg.SendsPerConn, l.cfg.SendsPerUser, l.cfg.SendsPerRoom)
	}
	return l.sendWith(c, now, applimits.Or(own.SendsPerConn, l.cfg.SendsPerConn),
		applimits.Or(own.SendsPerUser, l.cfg.SendsPerUser), applimits.Or(own.SendsPerRoom, l.cfg.SendsPerRoom))
}

func (l *limiter) sendWith(c *conn, now time.Time, perConn, perUser, perRoom ratelimit.Limit) (string, time.Duration) {
	if ok, retry := c.sends.rate.Take(perConn, now); !ok {
		return limitSendConn, retry
	}
	if ok, retry := l.users.Take(userKey{c.app, c.uid}, perUser, now); !ok {
		return limitSendUser, retry
	}
	if ok, retry := l.rooms.Take(roomKey{c.app, c.room}, perRoom, now); !ok {
		return limitSendRoom, retry
	}
	return "", 0
}

// limitHit counts a refusal by limit and logs it, sampled: an attack must not flood the log.
func (n *Node) limitHit(limit string, c *conn, now time.Time) {
	n.limits.limited.WithLabelValues(limit).Inc()
	n.sampledLog(now, "rate limit hit", "limit", limit, "addr", c.addr(), "app", c.app, "room", c.room, "uid", c.uid)
}

// handshakeFailed counts a TLS or WebSocket handshake that failed, apart those that never
// finished (slow-loris), and logs it sampled.
func (n *Node) handshakeFailed(nc net.Conn, what string, err error) {
	reason := "bad"
	if errors.Is(err, os.ErrDeadlineExceeded) {
		reason = "timeout"
	}
	n.limits.handshakes.WithLabelValues(what, reason).Inc()
	n.sampledLog(n.now(), "handshake failed", "what", what, "reason", reason, "peer", nc.RemoteAddr().String(), "err", err)
}

// sampledLog logs an attack pattern, each msg about once a second at most.
func (n *Node) sampledLog(now time.Time, msg string, args ...any) {
	if ok, _ := n.limits.sampled.Take(msg, ratelimit.Limit{Rate: 1, Burst: 5}, now); ok {
		n.log.Warn(msg, args...)
	}
}

// parseIPList reads lines "allow CIDR" or "deny CIDR" (a bare address is a /32 or /128);
// blank lines and lines starting with # are skipped. A denied address is refused; when the
// allow list is not empty, so is every address not on it, and one that is unknown.
func parseIPList(text string) (*applimits.Parsed, error) {
	var out applimits.Parsed
	sc := bufio.NewScanner(strings.NewReader(text))
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' {
			continue
		}
		verb, arg, _ := strings.Cut(s, " ")
		p, err := clientip.Parse([]string{arg})
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		switch verb {
		case "allow":
			out.Allow = append(out.Allow, p...)
		case "deny":
			out.Deny = append(out.Deny, p...)
		default:
			return nil, fmt.Errorf("line %d: want \"allow CIDR\" or \"deny CIDR\", got %q", line, s)
		}
	}
	return &out, sc.Err()
}

// reloadIPList reads the list file again when it changed since the last look (its
// modification time or size), or with force whether or not it did, and reports whether it
// read it. A file that cannot be read or does not parse leaves the lists in force and is
// reported once, not at every look, until it changes again.
func (l *limiter) reloadIPList(path string, force bool) (read bool, err error) {
	st, err := os.Stat(path)
	if err != nil {
		err = fmt.Errorf("ip list: %w", err)
		if !force && err.Error() == l.listErr {
			return false, nil
		}
		l.listErr, l.listMod = err.Error(), time.Time{} // read it when it is back
		return false, err
	}
	if !force && st.ModTime().Equal(l.listMod) && st.Size() == l.listSize {
		return false, nil // the list in force, or the same bad file, reported already
	}
	l.listMod, l.listSize = st.ModTime(), st.Size()
	b, err := os.ReadFile(path)
	if err == nil {
		var lists *applimits.Parsed
		if lists, err = parseIPList(string(b)); err == nil {
			l.lists.Store(lists)
			l.listErr = ""
			return true, nil
		}
	}
	err = fmt.Errorf("ip list %s: %w", path, err)
	l.listErr = err.Error()
	return false, err
}

// ipListLoop reads the IP list file again when it changes (looked at every second) and when
// the process gets SIGHUP (hup), then stops watching the signal.
func (n *Node) ipListLoop(hup chan os.Signal) {
	defer signal.Stop(hup)
	t := time.NewTicker(ipListInterval)
	defer t.Stop()
	for {
		force := false
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-hup:
			force = true
		}
		read, err := n.limits.reloadIPList(n.cfg.IPListFile, force)
		switch {
		case err != nil:
			n.limits.reloads.WithLabelValues("error").Inc()
			n.log.Warn("ip list not reloaded: the lists in force stay", "err", err)
		case read:
			n.limits.reloads.WithLabelValues("ok").Inc()
			lists := n.limits.lists.Load()
			n.log.Info("ip list reloaded", "file", n.cfg.IPListFile, "allow", len(lists.Allow), "deny", len(lists.Deny), "sighup", force)
		}
	}
}

// followAppLimits opens the apps' limits bucket and reads it.
func followAppLimits(ctx context.Context, n *Node) (*applimits.Watcher, error) {
	st, err := applimits.Open(ctx, n.js, n.cfg.KVReplicas)
	if err != nil {
		return nil, fmt.Errorf("chatlink: %w", err)
	}
	w, err := st.Follow(ctx, n.log)
	if err != nil {
		return nil, fmt.Errorf("chatlink: %w", err)
	}
	return w, nil
}
