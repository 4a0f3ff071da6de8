// Package cdnpusher turns a room's CDN lanes into segments on object storage: it gathers the
// messages handed to it per room and per time window, keeps at most a cap of them per window
// by sampling, and writes one immutable, gzip-compressed segment per window (an empty one for a
// quiet window) to S3, retrying with backoff while storage fails; and it deletes the segments
// under its prefix that are older than the segment TTL, whoever wrote them. docs/cdn.md
// describes the segments and the pusher.
//
// It must never make its caller wait on storage: Add only touches memory, and what storage
// cannot take in time is dropped and counted as a gap, never buffered without bound. It does not
// decide which rooms or lanes take the CDN path, and it never publishes a message that carries a
// tag expression.
package cdnpusher
