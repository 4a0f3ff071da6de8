package sdk

import (
	"math"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// pollState is where the poller stands in the room's windows. Times are the server's, in
// milliseconds since the Unix epoch.
type pollState struct {
	app, room string
	window    int64              // 0 before the first round
	next      int64              // the first index not asked for yet
	sched     int64              // the latest round's time, before its jitter
	roundAt   int64              // the next round's time, with its jitter; 0: not scheduled
	retry     map[int64]*retryAt // indexes asked for and not fetched yet
}

// retryAt is when to ask for a missing segment again.
type retryAt struct {
	at    int64
	delay int64 // the wait before at, doubling from a fifth of a window up to a window
}

// pollLoop polls the room's segments while it is in CDN mode, until stop.
func (p *cdnPoller) pollLoop() {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var st pollState
	for {
		wait := time.Hour
		if snap := p.snapshot(); snap.conf != nil {
			wait = p.round(&st, snap)
		} else {
			p.endPlayout()
			st = pollState{}
		}
		timer.Reset(wait)
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
	}
}

// round asks for what is due and returns how long until something else is.
//
// Segment i is due at the end of its window plus the pusher's grace (learned from next_at_ms)
// plus a tenth of a window (storeMarginDiv) for the pusher to store it: a poll that comes too
// early costs a 404 and, behind a CDN that caches the 404 for a second, a segment that comes
// late.
// A round asks for every segment due, and the next round comes when the next segment is due or
// a poll interval after this one, whichever is later, plus a random jitter: one request per
// window and viewer when the interval is the window, spread so that viewers do not poll in
// step. A segment that is missing (404) or that no vendor served is asked for again, a fifth of
// a window later and then less and less often, until gapAfterWindows after its window's end,
// when it counts as a gap; later segments do not wait for it. A room leaving CDN mode (an off
// config with a last_index) is polled up to last_index: once every segment up to it is in or a
// gap, the mode is off (drained).
func (p *cdnPoller) round(st *pollState, snap snapshot) time.Duration {
	conf := snap.conf
	w := int64(conf.GetWindowMs())
	interval := int64(conf.GetPollIntervalMs())
	if interval == 0 {
		interval = w
	}
	grace := snap.grace.Milliseconds()
	due := func(i int64) int64 { return (i+1)*w + grace + w/storeMarginDiv }
	now := serverNow(snap.offset)
	current := segment.Index(now, uint32(w))
	// Leaving CDN mode: nothing after the last segment is written.
	last := int64(math.MaxInt64)
	if conf.GetMode() == clientpb.CdnMode_CDN_MODE_OFF {
		last = conf.GetLastIndex()
	}
	switch {
	case st.window != w || st.app != snap.app || st.room != snap.room || st.next > current+2:
		// A new room or window, or a server clock that went back: start at the current window.
		*st = pollState{app: snap.app, room: snap.room, window: w, next: current, retry: map[int64]*retryAt{}}
	case st.next < current-maxLagWindows:
		skipped := current - st.next + int64(len(st.retry))
		p.gaps.Add(uint64(skipped))
		p.log.Warn("roomcast: CDN polling fell behind; skipping windows", "windows", skipped)
		st.next, st.roundAt = current, 0
		clear(st.retry)
	}
	if st.roundAt == 0 {
		st.sched = due(st.next)
		st.roundAt = st.sched + jitter(conf)
	}
	if now >= st.roundAt {
		for ; due(st.next) <= now && st.next <= last && p.polling(); st.next++ {
			p.ask(st, snap, st.next, now)
		}
		st.sched = max(st.sched+interval, due(st.next))
		st.roundAt = st.sched + jitter(conf)
	}
	for i, r := range st.retry {
		if r.at <= now && p.polling() {
			p.ask(st, snap, i, now)
		}
	}
	if st.next > last && len(st.retry) == 0 {
		// Every segment up to the last is in or given up: the mode is off from here.
		p.drained(conf)
		return time.Millisecond
	}
	next := st.roundAt
	for _, r := range st.retry {
		next = min(next, r.at)
	}
	return max(time.Duration(next-serverNow(snap.offset))*time.Millisecond, time.Millisecond)
}

// ask fetches segment i and hands its messages on, or schedules it again, or gives it up.
func (p *cdnPoller) ask(st *pollState, snap snapshot, i, now int64) {
	w := st.window
	seg, ok := p.fetch(snap, i)
	if ok {
		delete(st.retry, i)
		p.sampled.Add(uint64(seg.GetSampled()))
		p.d.segment(seg.GetMessages())
		p.learnGrace(w, i, seg.GetNextAtMs())
		return
	}
	if now > (i+1+gapAfterWindows)*w {
		delete(st.retry, i)
		p.gaps.Add(1)
		p.log.Debug("roomcast: CDN segment missing for good: a gap", "index", i)
		return
	}
	r := st.retry[i]
	if r == nil {
		r = &retryAt{delay: max(w/5, 20)}
		st.retry[i] = r
	} else {
		r.delay = min(2*r.delay, w)
	}
	r.at = now + r.delay + jitter(snap.conf)/4
}

// serverNow is the server's clock, in milliseconds, given its offset from ours.
func serverNow(offset time.Duration) int64 { return time.Now().Add(offset).UnixMilli() }
