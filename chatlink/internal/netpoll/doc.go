// Package netpoll tells the ChatLink which idle client sockets have become readable, from one
// epoll instance, so that an idle connection needs no goroutine of its own: a parked reader
// goroutine costs a 2 KiB stack and its runtime bookkeeping, about half of what an idle
// connection costs otherwise. It also reads and writes such sockets without waiting.
//
// It knows descriptors and readiness, not protocols: it never parses what it reads, keeps no
// per-connection buffer and never closes a socket (its owner does). Linux only; elsewhere
// Supported is false and New fails.
package netpoll
