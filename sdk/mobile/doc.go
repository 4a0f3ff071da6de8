// Package mobile is the Roomcast client for Android and iOS apps: a facade over the Go SDK
// (roomcast/sdk) that `gomobile bind` turns into an Android library (.aar) and an iOS
// framework (.xcframework); docs/mobile.md says how.
//
// Its exported API keeps to what gobind can bind: strings, signed numbers, bools, byte slices,
// pointers to this package's structs, the Listener interface the app implements, and errors.
// The Go SDK's channels, contexts, durations, unsigned numbers and protobuf types stay inside:
// durations are milliseconds, lanes and event kinds are strings, and a Send is bounded by
// Config.SendTimeoutMs and by Close instead of a context.
//
// The package adds no behaviour of its own to the Go SDK's reconnecting, recovery,
// de-duplication and ordering: it converts types. Its one addition is the app's lifecycle
// (NetworkChanged, EnterBackground, EnterForeground), on top of the Go SDK's Reconnect, Pause
// and Resume: a timer that pauses the Client after a linger in the background, which Close
// stops. It keeps no global state, and every goroutine it runs is the Go SDK's, which Close
// waits for.
package mobile
