// Package sdk is the Go client for Roomcast and the reference implementation of the wire
// protocol in docs/protocol.md; docs/go-sdk.md is its guide.
//
// A Client is a member's connection to its room that stays up. Dial asks the dispatcher where
// to connect (or uses Config.Endpoints), tries the endpoints in order over WebSocket or TCP,
// logs in with the token, and returns once the LoginAck arrived. From then on the Client sends
// heartbeats, answers Send with the matching SendAck or Error, and hands every message of the
// room to Config.OnMessage once, ordered by (server time, id), and its events (connected,
// reconnecting, recovered, thinned, kicked, limited, counters, error, closed) to Config.OnEvent,
// on one goroutine. AddCounter taps the room's counters (likes, gifts), whose running totals come
// as CounterEvents, never a message per tap. A member the room names a moderator mutes, unmutes
// and removes the members of its scope with Mute, Unmute and Remove, and recalls their messages
// with RecallAsModerator.
// A recalled message comes as a RecalledEvent, and from then on the Client never hands it over,
// whichever way a copy comes; Recall recalls one of this member's own where the room allows it.
//
// When the room is in CDN mode (docs/cdn.md), the Client also polls the room's segments from
// the CDN vendors its config names, following live changes of the config, and hands their
// messages on merged with the pushed ones, in the same order, each at its play time so that a
// window's messages are spread over the window; Client.CDNStats counts what it did.
//
// When the connection ends for a transient reason (a close code outside 4000–4499, a drop, a
// silent server, a protocol error, a slow OnMessage) or the server asks the client to move (a
// draining ChatLink), the Client dispatches again and logs in elsewhere, with backoff and
// jitter (a move tries the other nodes first, and again until it gets in or the old connection
// ends), asking to recover the messages after the last one it received; a RecoveredEvent says
// whether that was all of them or how many the room no longer keeps. A terminal close code,
// Close, or any end with Config.NoReconnect stops it: Done is closed and Err says why.
//
// The package keeps no global state, starts no goroutine that Close does not wait for, and
// logs only through the injected Config.Logger. It imports nothing of Roomcast but proto/clientpb
// (the client protocol) and proto/segment (the segment format): no gRPC, no server API or bus
// types (internal/deptest's TestClosures checks).
package sdk
