package callback

import (
	"sync"
	"time"
)

// BreakerConfig configures a hook's circuit breaker. Closed, calls go out and their outcomes
// are counted; it opens after Failures failures in a row, or when at least FailureRate of the
// last Window calls failed. Open, no call goes out (each is decided by the failure policy) for
// OpenFor; then it is half-open: up to Probes calls go out, and it closes when Probes of them
// succeeded, or opens again at the first that fails.
type BreakerConfig struct {
	// Failures is how many failures in a row open the breaker. Zero value means 5.
	Failures int
	// FailureRate is the share of failed calls among the last Window that opens the breaker.
	// Zero value means 0.5; more than 1 means never by rate.
	FailureRate float64
	// Window is how many of the last calls FailureRate is taken over; the rate applies once
	// that many were made since the breaker last closed. Zero value means 20.
	Window int
	// OpenFor is how long the breaker stays open before it lets probes through. Zero value
	// means 5s.
	OpenFor time.Duration
	// Probes is how many successful probes close a half-open breaker. Zero value means 1.
	Probes int
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures <= 0 {
		c.Failures = 5
	}
	if c.FailureRate <= 0 {
		c.FailureRate = 0.5
	}
	if c.Window <= 0 {
		c.Window = 20
	}
	if c.OpenFor <= 0 {
		c.OpenFor = 5 * time.Second
	}
	if c.Probes <= 0 {
		c.Probes = 1
	}
	return c
}

// breakerState is a breaker's state; its value is the breaker_state metric's.
type breakerState int

const (
	stateClosed breakerState = iota
	stateHalfOpen
	stateOpen
)

func (s breakerState) String() string {
	return [...]string{"closed", "half-open", "open"}[s]
}

// breaker is a circuit breaker (BreakerConfig).
type breaker struct {
	cfg      BreakerConfig
	onChange func(from, to breakerState) // called with mu held

	mu       sync.Mutex // guards the fields below
	state    breakerState
	inRow    int    // failures in a row (closed)
	outcomes []bool // the last calls' failures, a ring of cfg.Window (closed)
	next     int    // the ring's next slot
	seen     int    // outcomes in the ring
	failed   int    // failures in the ring
	openedAt time.Time
	probing  int // probes let through and not yet recorded (half-open)
	probesOK int // probes that succeeded (half-open)
}

func newBreaker(cfg BreakerConfig, onChange func(from, to breakerState)) *breaker {
	cfg = cfg.withDefaults()
	return &breaker{cfg: cfg, onChange: onChange, outcomes: make([]bool, cfg.Window)}
}

// allow reports whether a call may go out now, and whether it goes out as a half-open probe
// (whose outcome record or forget must then be told).
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == stateOpen && now.Sub(b.openedAt) >= b.cfg.OpenFor {
		b.set(stateHalfOpen)
		b.probing, b.probesOK = 0, 0
	}
	switch b.state {
	case stateClosed:
		return true, false
	case stateHalfOpen:
		if b.probing+b.probesOK < b.cfg.Probes {
			b.probing++
			return true, true
		}
	}
	return false, false
}

// record counts a call's outcome. A call let through while closed but ending after the breaker
// opened counts for nothing.
func (b *breaker) record(probe, ok bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && b.state == stateHalfOpen:
		b.probing--
		if !ok {
			b.open(now)
			return
		}
		if b.probesOK++; b.probesOK >= b.cfg.Probes {
			b.close()
		}
	case !probe && b.state == stateClosed:
		if b.seen == len(b.outcomes) && b.outcomes[b.next] {
			b.failed--
		}
		b.outcomes[b.next] = !ok
		b.next = (b.next + 1) % len(b.outcomes)
		b.seen = min(b.seen+1, len(b.outcomes))
		if ok {
			b.inRow = 0
			return
		}
		b.failed++
		b.inRow++
		if b.inRow >= b.cfg.Failures || (b.seen == len(b.outcomes) && float64(b.failed) >= b.cfg.FailureRate*float64(b.seen)) {
			b.open(now)
		}
	}
}

// forget gives back a probe that was never made (its call was not sent).
func (b *breaker) forget(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	if b.state == stateHalfOpen {
		b.probing--
	}
	b.mu.Unlock()
}

// current returns the state, for tests.
func (b *breaker) current() breakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// open opens the breaker; caller holds mu.
func (b *breaker) open(now time.Time) {
	b.openedAt = now
	b.set(stateOpen)
}

// close closes the breaker with a clean count; caller holds mu.
func (b *breaker) close() {
	b.inRow, b.next, b.seen, b.failed = 0, 0, 0, 0
	clear(b.outcomes)
	b.set(stateClosed)
}

// set changes the state; caller holds mu.
func (b *breaker) set(to breakerState) {
	if from := b.state; from != to {
		b.state = to
		if b.onChange != nil {
			b.onChange(from, to)
		}
	}
}
