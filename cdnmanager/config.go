package cdnmanager

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/store/cdnstore"
)

// Config configures a manager instance.
type Config struct {
	// Bus is the NATS connection. Required; its server must have JetStream.
	Bus *nats.Conn
	// BaseURLs are where clients fetch segments (a CDN in front of the pushers' bucket and
	// prefix). Each is a default vendor, "{base}/{app}/{room}/{window_ms}/{index}", weight 1,
	// for apps whose policy names none. Zero value means none: such apps get no CDN mode.
	BaseURLs []string
	// Window is the segments' window; it must be the pushers' (rooms go only to pushers that
	// report this window). Zero value means cdnstore.DefaultWindow (1s).
	Window time.Duration
	// PollInterval and PollJitter are what members poll with, for apps whose policy sets none.
	// Zero values mean the window and a fifth of it.
	PollInterval, PollJitter time.Duration
	// OnlineThreshold puts a room that no pin holds in CDN mode while it has at least this many
	// members online, for apps whose policy sets none. Zero value (or negative) means never:
	// a member whose client does not poll segments (a native client on the bare protocol)
	// misses the lanes a room moves, so the rules are the app's choice (its policy) or the
	// deployment's (this setting), not a default.
	OnlineThreshold int64
	// FlowControlLevel puts such a room in CDN mode while a ChatLink holding its members reports
	// flow control at least this strong (0 to 1). Zero value (or negative) means never, for the
	// same reason.
	FlowControlLevel float64
	// RuleHold is how long a room the rules put in CDN mode stays there after they last held,
	// so that a room near a threshold does not flap. Zero value means 1m.
	RuleHold time.Duration
	// PusherLease is how long a pusher outlives its last report before its rooms go to
	// others. Zero value means 1.5s (three of a pusher's default report intervals).
	PusherLease time.Duration
	// NodeLease is how long a ChatLink's counts and flow control outlive its last report. Zero
	// value means 5s.
	NodeLease time.Duration
	// LeaderTTL is the leader's lease: another instance leads this long after the leader
	// stopped renewing. Zero value means 3s.
	LeaderTTL time.Duration
	// Tick is how often the leader looks at the rooms. Zero value means 250ms.
	Tick time.Duration
	// KVReplicas is the replication of the KV buckets. Zero value means 1.
	KVReplicas int
	// ID names the instance in the leader's lease. Zero value means a random one.
	ID string
	// Now is the clock of leases, rules and window indexes. Zero value means time.Now.
	Now func() time.Time
	// Log receives the manager's logs. Zero value means none.
	Log *slog.Logger
	// Registerer receives the manager's metrics. Zero value means they are not registered.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("cdnmanager: Config.Bus is required")
	}
	if c.Window < 0 || c.Window%time.Millisecond != 0 || c.Window > time.Hour {
		return c, fmt.Errorf("cdnmanager: Window %v is not a whole number of milliseconds up to 1h", c.Window)
	}
	for _, u := range c.BaseURLs {
		if err := cdnstore.CheckURL(u); err != nil {
			return c, fmt.Errorf("cdnmanager: base URL: %w", err)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Window, cdnstore.DefaultWindow)
	def(&c.PollInterval, c.Window)
	def(&c.PollJitter, c.Window/5)
	def(&c.RuleHold, time.Minute)
	def(&c.PusherLease, 1500*time.Millisecond)
	def(&c.NodeLease, 5*time.Second)
	def(&c.LeaderTTL, 3*time.Second)
	def(&c.Tick, 250*time.Millisecond)
	if c.OnlineThreshold == 0 {
		c.OnlineThreshold = -1
	}
	if c.FlowControlLevel == 0 {
		c.FlowControlLevel = -1
	}
	if c.KVReplicas <= 0 {
		c.KVReplicas = 1
	}
	if c.ID == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		c.ID = "cdnmanager-" + hex.EncodeToString(b)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
