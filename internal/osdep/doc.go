// Package osdep holds what differs between operating systems, so that the packages that need
// it build on every system Go does: what the system accounts for this process (the CPU time it
// has used, its peak resident memory, its limit on open files), an exclusive lock on a file,
// and a socket option set on a raw descriptor. What a system does not account for is reported
// as unknown (ok false), never as a made-up figure.
package osdep
