// Package netpoll tells which sockets have become readable, from epoll instances of its own, so
// that a connection needs no goroutine parked in a read: the ChatLink's client connections (a
// parked reader goroutine costs a 2 KiB stack and its runtime bookkeeping, about half of what an
// idle connection costs otherwise) and the load generator's raw clients (a reader goroutine is
// parked and woken for every frame, which took more of the shared cores than the server did).
// It also reads and writes such sockets without waiting (ReadNow, WritevNow), and can take a
// socket out of Go's runtime altogether (Detach) for an owner that reads it only from here.
//
// It knows descriptors and readiness, not protocols: it never parses what it reads, keeps no
// per-connection buffer and never closes a socket it did not detach (its owner does). Linux
// only; elsewhere Supported is false and New and Detach fail.
package netpoll
