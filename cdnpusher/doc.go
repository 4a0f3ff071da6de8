// Package cdnpusher will aggregate a room's bulk danmaku into static segments on object
// storage; not built yet.
package cdnpusher
