package sdk

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"roomcast/proto/clientpb"
)

const (
	// playMargin is what the play delay allows beyond a segment's expected time on storage and
	// the poll jitter: a fetch's round trip and a retry after a 404 from a segment written a
	// little late.
	playMargin = 300 * time.Millisecond
	// gapAfterWindows is how many windows after its end a segment may still be 404 before it
	// counts as a gap (docs/cdn.md, missing indexes).
	gapAfterWindows = 3
	// storeMarginDiv: a segment is polled a window / storeMarginDiv after its next_at_ms, the
	// time the pusher starts storing it, for the store to complete.
	storeMarginDiv = 10
	// maxLagWindows is how far behind the current window the poller may be (after the machine
	// slept, say) before it skips to the present: segments that old would only be late.
	maxLagWindows = 4
)

// CDNStats counts what a Client did on the CDN path since Dial (Client.CDNStats). All zero
// while its room was never in CDN mode, except Duplicates and Late, which count the long
// connection's messages too.
type CDNStats struct {
	// Polls is how many segment requests were made, to any vendor.
	Polls uint64
	// Hits is how many segments were fetched and accepted.
	Hits uint64
	// Misses is how many requests found no segment (404): not written yet, or a gap.
	Misses uint64
	// Failures is how many requests failed otherwise: a network error, a timeout, a status
	// other than 200 and 404, a segment that was garbage, truncated or of another room or
	// window. The Client then tries another vendor and, failing all, the segment again later.
	Failures uint64
	// Gaps is how many windows were given up: still missing several windows after their end,
	// or skipped because the poller fell that far behind (docs/cdn.md, missing indexes).
	Gaps uint64
	// Messages is how many messages came from segments (duplicates not counted); Sampled sums
	// the segments' sampled counts: messages the pusher's cap left out.
	Messages, Sampled uint64
	// Late is how many messages were handed to OnMessage after a message that sorts after them
	// (server time, id): they came after their play time, from a segment fetched late or over a
	// connection that was down.
	Late uint64
	// Duplicates is how many messages were dropped because their id had been handed on already.
	Duplicates uint64
}

// CDNStats returns the Client's counts on the CDN path.
func (c *Client) CDNStats() CDNStats {
	s := c.cdn.stats()
	s.Late, s.Duplicates, s.Messages = c.d.playStats()
	return s
}

// cdnPoller follows the room's CDN config (from each LoginAck and the CdnConfig frames of the
// connection listened to) and, in CDN mode, polls the room's segments from its vendors and hands
// their messages to the delivery, which merges them with the pushed ones.
//
// It runs two goroutines, started the first time the room is in CDN mode and stopped by stop: a
// poller (poll.go) and the delivery's player. Lock ordering is cdnPoller.mu -> delivery.mu.
type cdnPoller struct {
	cfg *Config
	log *slog.Logger
	d   *delivery

	polls, hits, misses, failures, gaps, sampled atomic.Uint64

	ctx    context.Context // ends with stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{} // one value: the config changed

	mu        sync.Mutex // guards the fields below
	gen       uint64     // the connection listened to
	app, room string
	conf      *clientpb.CdnConfig // nil outside CDN mode; mode off with last_index while draining
	offset    time.Duration       // the server's clock minus ours, from the latest LoginAck
	grace     time.Duration       // how long after its window ends a segment is on storage
	vendors   []*vendor           // conf's vendors that serve Config.Region
	hc        *http.Client
	transport *http.Transport // ours, idle connections closed by stop; nil with Config.CDNHTTPClient
	started   bool
	stopped   bool
}

func newCdnPoller(cfg *Config, d *delivery) *cdnPoller {
	p := &cdnPoller{cfg: cfg, log: cfg.Logger, d: d, wake: make(chan struct{}, 1)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// login takes the LoginAck of connection gen, received at: the room, the server's clock and the
// room's CDN config (none: not in CDN mode).
func (p *cdnPoller) login(gen uint64, ack *clientpb.LoginAck, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen, p.app, p.room = gen, ack.GetApp(), ack.GetRoom()
	if ms := ack.GetServerTimeMs(); ms != 0 {
		p.offset = time.UnixMilli(ms).Sub(at)
	}
	p.applyLocked(ack.GetCdn())
}

// update takes a CdnConfig frame of connection gen; those of another connection (the old one
// during a move) are ignored.
func (p *cdnPoller) update(gen uint64, conf *clientpb.CdnConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen == p.gen {
		p.applyLocked(conf)
	}
}

// applyLocked makes conf the config in force. Caller holds p.mu.
//
// An off config with a last_index (the room leaves CDN mode, docs/cdn.md) keeps the polling,
// and the playout, going until every segment up to last_index was fetched or given up as a
// gap: the messages sent just before the switch are in those segments, not on the connection.
func (p *cdnPoller) applyLocked(conf *clientpb.CdnConfig) {
	pollable := conf.GetWindowMs() > 0 && len(conf.GetVendors()) > 0
	on := pollable && (conf.GetMode() != clientpb.CdnMode_CDN_MODE_OFF || conf.GetLastIndex() != 0)
	if on != (p.conf != nil) || (on && conf.GetMode() != p.conf.GetMode()) {
		p.log.Info("roomcast: CDN mode", "mode", conf.GetMode().String(), "window_ms", conf.GetWindowMs(), "vendors", len(conf.GetVendors()))
	}
	if !on {
		p.conf = nil
		if !p.started || p.stopped {
			p.d.setPlayout(0, p.offset)
		}
		// Else the poller hands on what is held (endPlayout) once a poll under way has merged
		// its segment: released now, the segment's messages would come after newer pushed ones.
		notify(p.wake)
		return
	}
	if p.conf == nil || p.conf.GetWindowMs() != conf.GetWindowMs() {
		p.grace = time.Duration(conf.GetWindowMs()) * time.Millisecond / 10 // until a segment says
	}
	p.conf = conf
	p.vendors = eligibleVendors(conf.GetVendors(), p.cfg.Region, p.vendors)
	p.d.setPlayout(p.playDelayLocked(), p.offset)
	if !p.started && !p.stopped {
		p.started = true
		p.hc = p.cfg.CDNHTTPClient
		if p.hc == nil {
			p.transport = &http.Transport{
				Proxy: http.ProxyFromEnvironment, TLSClientConfig: p.cfg.TLS.Clone(),
				MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: true,
			}
			p.hc = &http.Client{Transport: p.transport}
		}
		p.wg.Add(2)
		go p.pollLoop()
		go func() {
			defer p.wg.Done()
			p.d.play(p.ctx)
		}()
	}
	notify(p.wake)
}

// playDelayLocked is how long after its server time a message is handed on in CDN mode: the
// wait for its segment (a window, or the poll interval if longer; the time the pusher takes to
// store it; the poll jitter) and a margin: 1.7 s with the defaults (1 s windows and interval,
// 100 ms grace, 200 ms jitter). Caller holds p.mu.
func (p *cdnPoller) playDelayLocked() time.Duration {
	window := time.Duration(p.conf.GetWindowMs()) * time.Millisecond
	interval := time.Duration(p.conf.GetPollIntervalMs()) * time.Millisecond
	jitter := time.Duration(p.conf.GetPollJitterMs()) * time.Millisecond
	return max(window, interval) + p.grace + window/storeMarginDiv + jitter + playMargin
}

// learnGrace takes a segment's next_at_ms hint: how long after its window ends the pusher
// stores a segment. A change moves the polls and the play delay.
func (p *cdnPoller) learnGrace(window int64, index, nextAtMs int64) {
	g := time.Duration(nextAtMs-(index+2)*window) * time.Millisecond
	if nextAtMs == 0 || g < 0 || g > time.Duration(window)*time.Millisecond {
		return // no hint, or not one that makes sense
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conf == nil || int64(p.conf.GetWindowMs()) != window || (g-p.grace).Abs() < 10*time.Millisecond {
		return
	}
	p.grace = g
	p.d.setPlayout(p.playDelayLocked(), p.offset)
}

// endPlayout ends CDN mode's playout, handing on what is held in order, unless the mode came
// back on meanwhile. The poller calls it between polls, so no segment comes after it.
func (p *cdnPoller) endPlayout() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conf == nil {
		p.d.setPlayout(0, p.offset)
	}
}

// drained ends the polling of a room leaving CDN mode once the poller has every segment up to
// the last one (conf's last_index), unless another config came meanwhile.
func (p *cdnPoller) drained(conf *clientpb.CdnConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conf == conf {
		p.log.Info("roomcast: CDN mode off: the last segment polled", "last_index", conf.GetLastIndex())
		p.conf = nil
		notify(p.wake)
	}
}

// polling reports whether the room is in CDN mode: a round stops asking once it is not.
func (p *cdnPoller) polling() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conf != nil
}

// snapshot is what a poll round needs, read under p.mu.
type snapshot struct {
	conf      *clientpb.CdnConfig // nil outside CDN mode
	app, room string
	offset    time.Duration
	grace     time.Duration
}

func (p *cdnPoller) snapshot() snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return snapshot{conf: p.conf, app: p.app, room: p.room, offset: p.offset, grace: p.grace}
}

// stop ends the polling for good and waits for its goroutines. It may be called more than once.
func (p *cdnPoller) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
}

func (p *cdnPoller) stats() CDNStats {
	return CDNStats{
		Polls: p.polls.Load(), Hits: p.hits.Load(), Misses: p.misses.Load(),
		Failures: p.failures.Load(), Gaps: p.gaps.Load(), Sampled: p.sampled.Load(),
	}
}

// jitter returns a random wait in [0, conf's poll jitter).
func jitter(conf *clientpb.CdnConfig) int64 {
	if j := int64(conf.GetPollJitterMs()); j > 0 {
		return rand.Int64N(j)
	}
	return 0
}
