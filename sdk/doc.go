// Package sdk is the Go client for Roomcast and the reference implementation of the wire
// protocol in docs/protocol.md.
//
// A Client is one logged-in connection to a ChatLink. Dial asks the dispatcher where to connect
// (or uses Config.Endpoints), tries the endpoints in order over WebSocket or TCP, logs in with
// the token, and returns once the LoginAck arrived. After that the Client sends heartbeats,
// answers Send with the matching SendAck or Error, and hands pushed messages to
// Config.OnMessage. When the connection ends, for whatever reason, Done is closed, Err says why
// (a *CloseError for server closes) and Config.OnClose is called once.
//
// The package does not reconnect by itself: a Reconnect frame is reported through
// Config.OnReconnect, and the caller decides when to Dial again. It keeps no global state and
// logs only through the injected Config.Logger.
package sdk
