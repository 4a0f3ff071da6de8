// Package cdnmanager will decide per room whether bulk danmaku take the CDN path, hand rooms to
// pushers and deliver the CDN strategy to clients; not built yet.
package cdnmanager
