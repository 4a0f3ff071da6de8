package mobile

import "time"

// defaultBackgroundLinger is how long a Client in the background keeps its connection: about
// what iOS grants an app that asks for background time (beginBackgroundTask) before it is
// suspended, and long enough for an Android user who switches apps for a moment to come back
// to a live room.
const defaultBackgroundLinger = 25 * time.Second

// NetworkChanged tells the Client that the device's network changed (Wi-Fi to cellular, a
// network lost and another found): it leaves its connection at once, which may be dead
// without a sign (no close reaches a phone that left a network; the heartbeat would notice
// only after three intervals), connects again without waiting and recovers what it missed.
// On Android call it from ConnectivityManager.NetworkCallback.onAvailable; on iOS from an
// NWPathMonitor's update handler when the path is satisfied. It returns at once. In the
// background while paused, it does nothing until EnterForeground.
func (c *Client) NetworkChanged() { c.c.Reconnect() }

// EnterBackground tells the Client the app went to the background. It keeps its connection
// for Config.BackgroundLingerMs (messages keep coming to the Listener), then leaves it and
// stops reconnecting (an EventPaused) until EnterForeground, so that a backgrounded app
// neither drains the battery nor has its socket cut by the system mid-frame. On Android call
// it from the process's ON_STOP (ProcessLifecycleOwner); on iOS from
// sceneDidEnterBackground, inside a beginBackgroundTask that the app ends after the linger.
func (c *Client) EnterBackground() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.background != nil || c.cfg.BackgroundLingerMs < 0 {
		return
	}
	c.background = time.AfterFunc(millis(c.cfg.BackgroundLingerMs), c.c.Pause)
}

// EnterForeground tells the Client the app is in the foreground again: a connection kept
// through the background stays; a paused Client connects again at once and recovers what it
// missed meanwhile (an EventConnected, then an EventRecovered). On Android call it from the
// process's ON_START; on iOS from sceneWillEnterForeground.
func (c *Client) EnterForeground() {
	c.mu.Lock()
	if c.background != nil {
		c.background.Stop()
		c.background = nil
	}
	c.mu.Unlock()
	if c.c.Paused() {
		c.c.Resume()
	}
}

// Paused reports whether the Client has left its connection in the background
// (EnterBackground) and waits for EnterForeground.
func (c *Client) Paused() bool { return c.c.Paused() }
