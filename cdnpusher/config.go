package cdnpusher

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/store/cdnstore"
)

// DefaultMaxMessages is Config.MaxMessages's default, and --cdn-max-messages'.
const DefaultMaxMessages = 200

// Config configures a Pusher. Endpoint and Bucket are required; every other zero value means
// the default its comment gives.
type Config struct {
	// Endpoint is the S3 endpoint, host[:port], e.g. "s3.us-east-1.amazonaws.com". Required.
	Endpoint string
	// Secure talks HTTPS to Endpoint. Zero value means plain HTTP.
	Secure bool
	// Region of the bucket. Zero value means the client asks the endpoint.
	Region string
	// AccessKey and SecretKey sign requests. Zero values mean anonymous requests.
	AccessKey string
	SecretKey string
	// Bucket receives the segments. Required.
	Bucket string
	// Prefix goes in front of every key: {Prefix}{app}/{room}/{window_ms}/{index}. Zero value means
	// none; give it a trailing "/" to make it a folder.
	Prefix string

	// Window is the length of a segment's time window, a whole number of milliseconds. Zero value
	// means cdnstore.DefaultWindow (1s).
	Window time.Duration
	// Grace is how long after its end a window still takes messages (they travel from the room
	// service for a few milliseconds) before it is written. Zero value means 100ms; a negative
	// value means none.
	Grace time.Duration
	// MaxMessages caps a window's messages per room; beyond it messages are sampled, higher
	// lanes kept first. Zero value means DefaultMaxMessages.
	MaxMessages int
	// Idle is how long a room with no message keeps getting (empty) segments. Zero value means 5m.
	Idle time.Duration

	// Queue is how many written-out segments may wait for storage; when it is full the oldest is
	// dropped and counted as a gap. Zero value means 1024.
	Queue int
	// Writers is how many segments are written to storage at once. Zero value means 4.
	Writers int
	// WriteTimeout bounds one write attempt. Zero value means 5s.
	WriteTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts on one segment, doubling from the
	// first to the second. Zero values mean 100ms and 2s.
	RetryMin time.Duration
	RetryMax time.Duration
	// GiveUpAfter is how long after its window was closed a segment is still retried; then it is
	// dropped and counted as a gap. Zero value means 1m.
	GiveUpAfter time.Duration

	// SegmentTTL is how long a segment stays on storage after its window ends: then a sweep of
	// the bucket under Prefix deletes it, whoever wrote it. Zero value means DefaultSegmentTTL
	// (24h); a negative value means segments are never deleted (the bucket's own lifecycle rule,
	// or nothing, removes them).
	SegmentTTL time.Duration
	// SweepInterval is how often the pusher looks for expired segments (jittered by a quarter
	// either way; the first sweep comes within 30s of New). Zero value means an eighth of
	// SegmentTTL, at most 1h and at least 100ms.
	SweepInterval time.Duration

	// Now is the clock that closes windows and ages segments. Zero value means time.Now. (Retry backoff runs on
	// real time.)
	Now func() time.Time
	// Logger receives storage outages, recoveries and gaps. Zero value means no logs.
	Logger *slog.Logger
	// Registerer receives the pusher's metrics. Zero value means they are not registered.
	Registerer prometheus.Registerer
}

// withDefaults returns c with zero values replaced by their defaults, or an error for a config
// that cannot work.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Endpoint == "":
		return c, errors.New("cdnpusher: Endpoint is required")
	case c.Bucket == "":
		return c, errors.New("cdnpusher: Bucket is required")
	case c.Window < 0 || c.Window%time.Millisecond != 0 || c.Window > time.Hour:
		return c, fmt.Errorf("cdnpusher: Window %v is not a whole number of milliseconds up to 1h", c.Window)
	case c.MaxMessages < 0, c.Queue < 0, c.Writers < 0:
		return c, errors.New("cdnpusher: MaxMessages, Queue and Writers must not be negative")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Window, cdnstore.DefaultWindow)
	switch {
	case c.Grace == 0:
		c.Grace = 100 * time.Millisecond
	case c.Grace < 0:
		c.Grace = 0
	}
	def(&c.Idle, 5*time.Minute)
	def(&c.WriteTimeout, 5*time.Second)
	def(&c.RetryMin, 100*time.Millisecond)
	def(&c.RetryMax, 2*time.Second)
	def(&c.GiveUpAfter, time.Minute)
	if c.RetryMax < c.RetryMin {
		c.RetryMax = c.RetryMin
	}
	if c.MaxMessages == 0 {
		c.MaxMessages = DefaultMaxMessages
	}
	if c.Queue == 0 {
		c.Queue = 1024
	}
	if c.Writers == 0 {
		c.Writers = 4
	}
	if c.SegmentTTL == 0 {
		c.SegmentTTL = DefaultSegmentTTL
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = min(max(c.SegmentTTL/8, 100*time.Millisecond), time.Hour)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// windowMs is the window length as segments name it.
func (c Config) windowMs() uint32 { return uint32(c.Window / time.Millisecond) }
