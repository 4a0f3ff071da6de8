// Package loadgen is Roomcast's load generator, behind `roomcast bench`: it measures a running
// deployment from outside, the way clients and app backends use it. It is a tool, not part of
// the client SDK: only cmd/roomcast uses it.
//
//   - RunConns logs N idle members in and reports the server's RSS growth per connection.
//   - RunFanout puts N members in one room, publishes R messages per second through the server
//     API, and reports deliveries per second, losses per lane, latency and deliveries per
//     server CPU-second. With Config.Tags it is tag-targeted: members carry tags from their
//     login tokens and every message a tag expression (tags.go); expectations count each
//     message's audience only, and a receipt outside it is counted as leaked.
//   - RunLogin paces N logins (dispatch, connect, LoginAck) and reports their rate and latency.
//
// Clients are sdk.Clients, or with Config.Client "raw" members that speak the protocol
// themselves (raw.go), read on Linux by the ChatLink's poller, internal/netpoll (poll.go). Against a loopback target they dial from source addresses
// 127.0.0.1, 127.0.0.2, … (one address runs out of ports near 28,000), and a run with more
// clients than one process may hold (Config.PerProcess) spreads them over worker processes
// that run ServeWorker and report to the parent over their standard output.
//
// The package reads the server's figures only from its /metrics endpoint (or /proc for a
// local pid); it must not reach into servers, and it never changes anything on them but the
// settings of the room it benchmarks.
package loadgen
