package main

import (
	"flag"

	"roomcast/api"
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

// Set parses s; "0" sets ratelimit.Unlimited, since the components read a zero Limit as
// their default.
func (f limitFlag) Set(s string) error {
	l, err := ratelimit.Parse(s)
	if err == nil {
		if l.Off() {
			l = ratelimit.Unlimited
		}
		*f.l = l
	}
	return err
}

// bindAPILimitFlag binds the server API's call rate per key, its default api.DefaultCallLimits'.
func bindAPILimitFlag(fs *flag.FlagSet, l *ratelimit.Limit) {
	*l = api.DefaultCallLimits().PerKey
	fs.Var(limitFlag{l}, "limit-api-calls-per-key", "server API calls of one API key on one services instance; over it: HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED with RetryInfo, code 122: a `rate` RATE/s, RATE/m or RATE/h, optionally :BURST (0: none)")
}

// bindClientLimitFlags binds the ChatLink's client limits (docs/security.md) to lim, their
// defaults chatlink.DefaultLimits' (which says why these sizes), and its trusted proxies and
// address lists to c; after parsing, the returned function turns the counts' 0 (none) into
// what chatlink.Limits reads as none.
func bindClientLimitFlags(fs *flag.FlagSet, c *chatlink.Config) func() {
	lim := &c.Limits
	*lim = chatlink.DefaultLimits()
	rate := func(name string, l *ratelimit.Limit, what string) {
		fs.Var(limitFlag{l}, name, what+": a `rate` RATE/s, RATE/m or RATE/h, optionally :BURST (0: none)")
	}
	rate("limit-logins-per-ip", &lim.LoginsPerIP, "logins from one client address (IPv6: its /64; loopback is not limited) on this node; over it: Error 121 and Kick 4013 with retry_after_ms, after which the SDKs log in again; generous for carrier-grade NAT")
	rate("limit-logins-per-app", &lim.LoginsPerApp, "logins into one app on this node")
	rate("limit-joins-per-room", &lim.JoinsPerRoom, "logins into one room on this node; over it: Error 121 and Kick 4013 with retry_after_ms (the default lets a 60,000-member room join in a minute)")
	rate("limit-sends-per-conn", &lim.SendsPerConn, "Sends of one connection; over it: Error 120 with retry_after_ms")
	rate("limit-sends-per-user", &lim.SendsPerUser, "Sends of one user over all its connections on this node")
	rate("limit-sends-per-room", &lim.SendsPerRoom, "Sends into one room from this node")
	fs.IntVar(&lim.ConnectionsPerIP, "limit-connections-per-ip", lim.ConnectionsPerIP, "connections open from one client address (IPv6: its /64; loopback is not limited) on this node; more are refused (WebSocket: HTTP 429 with Retry-After; TCP: Kick 4015 with retry_after_ms), and the SDKs try again after the hint; generous for carrier-grade NAT (0: none)")
	rate("login-rate", &lim.LoginRate, "logins a ChatLink (in dev: each) processes, from every address together: a login over it waits, in arrival order, with its connection open, so a reconnect storm is spread out and the members already there keep their fan-out")
	fs.IntVar(&lim.LoginConcurrency, "login-concurrency", lim.LoginConcurrency, "logins a ChatLink (in dev: each) has past --login-rate at once (their requests to the services, their join); one more waits for one to finish, and fails with Kick 4504 if none does within 10 s (what the SDKs give a login); on a node short of CPU in a reconnect storm this keeps its logins from crowding out its members' fan-out, at the cost of slower logins when the services answer slowly (0: no bound)")
	fs.IntVar(&lim.LoginQueue, "login-queue", lim.LoginQueue, "logins that may wait for --login-rate; one more gets Error 121 and Kick 4013 with retry_after_ms (the time the queue takes to drain), after which the SDKs log in again (0: three seconds of --login-rate)")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "client connections a ChatLink (in dev: each) takes; logins beyond are refused with 4504 and it reports the number to the dispatcher (0: the open-file limit less 256)")
	fs.IntVar(&lim.TableSize, "limit-table-size", lim.TableSize, "addresses, users and rooms each rate limit remembers at most; the least active are forgotten first")
	fs.Var((*urls)(&c.TrustedProxies), "client-trusted-proxy", "address or CIDR of a proxy in front of the ChatLink's WebSocket listener whose X-Forwarded-For / X-Real-IP name the client its limits and address lists apply to (repeatable; default: none)")
	fs.StringVar(&c.IPListFile, "ip-list", c.IPListFile, "file of \"allow CIDR\" and \"deny CIDR\" lines for client addresses, re-read within a second when it changes and on SIGHUP (a file that does not parse keeps the lists in force); denied: HTTP 403 / Kick 4014 (default: all allowed)")
	return func() {
		for _, n := range []*int{&lim.ConnectionsPerIP, &lim.LoginConcurrency} {
			if *n == 0 {
				*n = -1
			}
		}
	}
}
