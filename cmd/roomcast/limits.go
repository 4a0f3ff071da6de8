package main

import (
	"flag"

	"roomcast/chatlink"
	"roomcast/internal/ratelimit"
)

// limitFlag is a flag holding a rate limit ("20/s:40", "0" for none).
type limitFlag struct{ l *ratelimit.Limit }

func (f limitFlag) String() string {
	if f.l == nil {
		return ""
	}
	return f.l.String()
}

func (f limitFlag) Set(s string) error {
	l, err := ratelimit.Parse(s)
	if err == nil {
		*f.l = l
	}
	return err
}

// bindAPILimitFlag binds the server API's call rate per key.
func bindAPILimitFlag(fs *flag.FlagSet, l *ratelimit.Limit) {
	*l, _ = ratelimit.Parse("5000/s:10000")
	fs.Var(limitFlag{l}, "limit-api-calls-per-key", "server API calls of one API key on one services instance; over it: HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED with RetryInfo, code 122: a `rate` RATE/s, RATE/m or RATE/h, optionally :BURST (0: none)")
}

// The deployment's defaults of the limits that refuse a login or a connection (docs/security.md
// says why these sizes). A refused client waits the server's hint and comes back (the SDKs and
// the load generator do), so a limit delays a crowd rather than losing it; still, the defaults
// are sized so that a big event does not meet them at all:
//   - joins per room: a 60,000-member room joining over a minute is 1,000/s on average, in
//     bursts; 2,000/s with a burst of 10,000 lets that in without a refusal.
//   - logins and connections per address: carrier-grade NAT puts hundreds to thousands of
//     mobile subscribers behind one public address, so the limits are a multiple of what one
//     device needs: 50 logins/s with a burst of 500, and 5,000 connections. They stop one
//     source from holding a node, not a shared address from watching.
//   - logins per node (--login-rate): not a refusal but a pace, logins over it wait their
//     turn (docs/edge.md). A TCP login that recovers its room's history costs the node
//     0.14-0.19 ms of CPU, a WebSocket one through the dispatcher up to 0.43 ms: 3,000/s is at most
//     0.4-1.3 cores, and 15,000 clients of a dead node are in within about 5 s.
//   - logins in progress per node (--login-concurrency): 64. It keeps a reconnect storm on a
//     CPU-starved node from holding its members' messages (7 of 7 storm runs within 2x,
//     against 2 of 6 and 2 of 3 without), and a dead node's 2,000 WebSocket clients still come back
//     through the dispatcher in 2.1-2.5 s, now that a room's recoveries share their history
//     reads (docs/reliability.md).
const (
	defaultLoginRate        = "3000/s:300"
	defaultLoginConcurrency = 64
	defaultLoginsPerIP      = "50/s:500"
	defaultJoinsPerRoom     = "2000/s:10000"
	defaultConnectionsPerIP = 5000
)

// bindClientLimitFlags binds the ChatLink's client limits (docs/security.md) with the
// deployment's defaults; the returned function copies them into a Config.
func bindClientLimitFlags(fs *flag.FlagSet) func(*chatlink.Config) {
	var (
		lim      chatlink.Limits
		trusted  []string
		listFile string
		maxConns int
	)
	rate := func(name string, l *ratelimit.Limit, def, what string) {
		*l, _ = ratelimit.Parse(def)
		fs.Var(limitFlag{l}, name, what+": a `rate` RATE/s, RATE/m or RATE/h, optionally :BURST (0: none)")
	}
	rate("limit-logins-per-ip", &lim.LoginsPerIP, defaultLoginsPerIP, "logins from one client address (IPv6: its /64; loopback is not limited) on this node; over it: Error 121 and Kick 4013 with retry_after_ms, after which the SDKs log in again; generous for carrier-grade NAT")
	rate("limit-logins-per-app", &lim.LoginsPerApp, "0", "logins into one app on this node")
	rate("limit-joins-per-room", &lim.JoinsPerRoom, defaultJoinsPerRoom, "logins into one room on this node; over it: Error 121 and Kick 4013 with retry_after_ms (the default lets a 60,000-member room join in a minute)")
	rate("limit-sends-per-conn", &lim.SendsPerConn, "20/s:40", "Sends of one connection; over it: Error 120 with retry_after_ms")
	rate("limit-sends-per-user", &lim.SendsPerUser, "40/s:80", "Sends of one user over all its connections on this node")
	rate("limit-sends-per-room", &lim.SendsPerRoom, "0", "Sends into one room from this node")
	rate("limit-counter-adds-per-conn", &lim.CounterAddsPerConn, "5/s:10", "CounterAdds (taps of a like, gifts) of one connection; over it: Error 120 with retry_after_ms")
	fs.IntVar(&lim.ConnectionsPerIP, "limit-connections-per-ip", defaultConnectionsPerIP, "connections open from one client address (IPv6: its /64; loopback is not limited) on this node; more are refused (WebSocket: HTTP 429 with Retry-After; TCP: Kick 4015 with retry_after_ms), and the SDKs try again after the hint; generous for carrier-grade NAT (0: none)")
	rate("login-rate", &lim.LoginRate, defaultLoginRate, "logins a ChatLink (in dev: each) processes, from every address together: a login over it waits, in arrival order, with its connection open, so a reconnect storm is spread out and the members already there keep their fan-out")
	fs.IntVar(&lim.LoginConcurrency, "login-concurrency", defaultLoginConcurrency, "logins a ChatLink (in dev: each) has past --login-rate at once (their requests to the services, their join); one more waits for one to finish, and fails with Kick 4504 if none does within 10 s (what the SDKs give a login); on a node short of CPU in a reconnect storm this keeps its logins from crowding out its members' fan-out, at the cost of slower logins when the services answer slowly (0: no bound)")
	fs.IntVar(&lim.LoginQueue, "login-queue", 0, "logins that may wait for --login-rate; one more gets Error 121 and Kick 4013 with retry_after_ms (the time the queue takes to drain), after which the SDKs log in again (0: three seconds of --login-rate)")
	fs.IntVar(&maxConns, "max-connections", 0, "client connections a ChatLink (in dev: each) takes; logins beyond are refused with 4504 and it reports the number to the dispatcher (0: the open-file limit less 256)")
	fs.IntVar(&lim.TableSize, "limit-table-size", 0, "addresses, users and rooms each rate limit remembers at most; the least active are forgotten first (0: 65536)")
	fs.Var((*urls)(&trusted), "client-trusted-proxy", "address or CIDR of a proxy in front of the ChatLink's WebSocket listener whose X-Forwarded-For / X-Real-IP name the client its limits and address lists apply to (repeatable; default: none)")
	fs.StringVar(&listFile, "ip-list", "", "file of \"allow CIDR\" and \"deny CIDR\" lines for client addresses, re-read within a second when it changes and on SIGHUP (a file that does not parse keeps the lists in force); denied: HTTP 403 / Kick 4014 (default: all allowed)")
	return func(c *chatlink.Config) {
		c.Limits, c.TrustedProxies, c.IPListFile = lim, trusted, listFile
		if maxConns > 0 {
			c.MaxConnections = maxConns
		}
	}
}
