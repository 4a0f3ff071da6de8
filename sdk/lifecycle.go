package sdk

import "errors"

// A mobile app's lifecycle, which the Client cannot see by itself: the device changed networks
// (its connection may be dead without a word: no FIN or RST reaches a phone that left a Wi-Fi
// network), or the app went to the background, where it should not keep a connection up for
// long. The mobile facade (sdk/mobile) calls these; any app may.

var (
	// ErrNetworkChanged is why a connection was left by Client.Reconnect.
	ErrNetworkChanged = errors.New("roomcast: the network changed")
	// ErrPaused is why a connection was left by Client.Pause.
	ErrPaused = errors.New("roomcast: paused")
)

// Reconnect leaves the live connection at once, without waiting for it to time out, and
// connects again without a backoff wait, recovering what was missed meanwhile: for an app
// whose device changed networks, where the old connection may be silently dead. While the
// Client is reconnecting already, it cuts the wait before the next attempt short. A
// ReconnectingEvent with ErrNetworkChanged follows.
func (c *Client) Reconnect() { c.interrupt(ErrNetworkChanged, false) }

// Pause leaves the live connection and stops reconnecting until Resume: for an app in the
// background. A ReconnectingEvent with ErrPaused says so; messages sent to the room
// meanwhile come by recovery after Resume (as many as the room keeps). Sends wait, as while
// reconnecting.
func (c *Client) Pause() { c.interrupt(ErrPaused, true) }

// Resume ends a Pause: the Client connects again at once and recovers what it missed.
func (c *Client) Resume() {
	c.mu.Lock()
	c.paused = false
	c.mu.Unlock()
	notify(c.wake)
}

// Paused reports whether the Client is paused.
func (c *Client) Paused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused
}

// interrupt ends the live connection with err (and, with pause, holds reconnecting), and wakes
// a reconnect that waits.
func (c *Client) interrupt(err error, pause bool) {
	c.mu.Lock()
	if pause {
		c.paused = true
	}
	cur := c.cur
	c.mu.Unlock()
	notify(c.wake)
	if cur != nil {
		cur.fail(err)
	}
}

// waitResumed waits until the Client is not paused, or closed (false).
func (c *Client) waitResumed() bool {
	for c.Paused() {
		select {
		case <-c.ctx.Done():
			return false
		case <-c.wake:
		}
	}
	return true
}

// byApp reports whether err is an end the app asked for: no failure of the server's, so no
// backoff.
func byApp(err error) bool { return errors.Is(err, ErrNetworkChanged) || errors.Is(err, ErrPaused) }
