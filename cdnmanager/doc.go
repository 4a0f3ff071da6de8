// Package cdnmanager decides which rooms take the CDN path and who writes their segments. It
// keeps each room's CDN mode (off, bulk, normal and bulk), pinned by the app through the server
// API or set by the app's rules (members online over a threshold, a ChatLink's flow control over
// a level); assigns every room in CDN mode to a live pusher instance and records it in
// JetStream KV (a CdnRoute per room, which the room service routes by and the pushers follow);
// moves rooms when pushers come, leave or are lost; and tells the members of a room, through
// their ChatLinks, the CdnConfig they poll with whenever it changes (a room leaving CDN mode
// does so two windows ahead, and its members are told the last segment to poll). What the
// server API reads and writes, the apps' policies and the rooms' pins, and the routes are
// defined in store/cdnstore.
//
// Any number of instances run; one, the leader (a lease in JetStream KV), decides, the others
// follow its records and stand by. It must not carry messages (the room service sends them to
// the pushers) nor touch object storage (the pushers write it), and it never puts a room in CDN
// mode without a live pusher and a vendor to poll.
package cdnmanager
