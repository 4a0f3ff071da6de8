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

// bindClientLimitFlags binds the ChatLink's client limits (docs/security.md) with the
// deployment's defaults; the returned function copies them into a Config. The limits that
// close a login (per address, per room) and the connections per address are off by default:
// the SDKs do not reconnect after Kick 4013 yet, so a flash crowd over a room's join rate would
// lose its viewers for good, and carrier-grade NAT puts thousands of viewers behind one address.
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
	rate("limit-logins-per-ip", &lim.LoginsPerIP, "0", "logins from one client address (IPv6: its /64) on this node; over it: Error 121 and Kick 4013")
	rate("limit-logins-per-app", &lim.LoginsPerApp, "0", "logins into one app on this node")
	rate("limit-joins-per-room", &lim.JoinsPerRoom, "0", "logins into one room on this node")
	rate("limit-sends-per-conn", &lim.SendsPerConn, "20/s:40", "Sends of one connection; over it: Error 120 with retry_after_ms")
	rate("limit-sends-per-user", &lim.SendsPerUser, "40/s:80", "Sends of one user over all its connections on this node")
	rate("limit-sends-per-room", &lim.SendsPerRoom, "0", "Sends into one room from this node")
	fs.IntVar(&lim.ConnectionsPerIP, "limit-connections-per-ip", 0, "connections open from one client address (IPv6: its /64); more are refused (WebSocket: HTTP 429; TCP: Kick 4015) (0: none)")
	fs.IntVar(&maxConns, "max-connections", 0, "client connections a ChatLink (in dev: each) takes; logins beyond are refused with 4504 and it reports the number to the dispatcher (0: the open-file limit less 256)")
	fs.IntVar(&lim.TableSize, "limit-table-size", 0, "addresses, users and rooms each rate limit remembers at most; the least active are forgotten first (0: 65536)")
	fs.Var((*urls)(&trusted), "client-trusted-proxy", "address or CIDR of a proxy in front of the ChatLink's WebSocket listener whose X-Forwarded-For / X-Real-IP name the client its limits and address lists apply to (repeatable; default: none)")
	fs.StringVar(&listFile, "ip-list", "", "file of \"allow CIDR\" and \"deny CIDR\" lines for client addresses, re-read within a second when it changes; denied: HTTP 403 / Kick 4014 (default: all allowed)")
	return func(c *chatlink.Config) {
		c.Limits, c.TrustedProxies, c.IPListFile = lim, trusted, listFile
		if maxConns > 0 {
			c.MaxConnections = maxConns
		}
	}
}
