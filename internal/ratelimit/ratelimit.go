// Package ratelimit keeps token buckets by key (an address, a user, a room, an API key) in a
// table of bounded size, and parses limits from flags. It says how long a caller must wait; it
// must not decide what a refused caller is told.
package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limit is a token bucket: Rate tokens a second, at most Burst saved. A zero Rate means no limit.
type Limit struct {
	Rate  float64
	Burst int
}

// Unlimited limits nothing, where a zero Limit stands for a default (chatlink.Limits,
// api.CallLimits).
var Unlimited = Limit{Rate: -1}

// Off reports whether l limits nothing.
func (l Limit) Off() bool { return l.Rate <= 0 }

func (l Limit) String() string {
	if l.Off() {
		return "0"
	}
	return strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/s:" + strconv.Itoa(l.Burst)
}

// Parse reads a limit: "0" (none), "RATE/UNIT" or "RATE/UNIT:BURST", UNIT one of s, m, h
// ("20/s:50": 20 a second, 50 at once). Without a burst, the burst is the rate per second
// rounded up, at least 1.
func Parse(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "0" || s == "" {
		return Limit{}, nil
	}
	spec, burstText, hasBurst := strings.Cut(s, ":")
	num, unit, ok := strings.Cut(spec, "/")
	var per time.Duration
	switch unit {
	case "s":
		per = time.Second
	case "m":
		per = time.Minute
	case "h":
		per = time.Hour
	}
	n, err := strconv.ParseFloat(num, 64)
	if !ok || per == 0 || err != nil || n <= 0 || n > 1e9 {
		return Limit{}, fmt.Errorf("limit %q: want 0, RATE/s, RATE/m or RATE/h, optionally :BURST (e.g. 20/s:50)", s)
	}
	l := Limit{Rate: n / per.Seconds()}
	l.Burst = max(1, int(l.Rate+0.999))
	if hasBurst {
		b, err := strconv.Atoi(burstText)
		if err != nil || b < 1 || b > 1e9 {
			return Limit{}, fmt.Errorf("limit %q: the burst must be a whole number from 1", s)
		}
		l.Burst = b
	}
	return l, nil
}

// Millis rounds a wait up to whole milliseconds, at least 1: the retry hint clients are told.
func Millis(d time.Duration) uint32 {
	return uint32(max(1, (d+time.Millisecond-1)/time.Millisecond))
}

// Bucket is one token bucket, for a limit held by its owner (a connection's sends). Its zero
// value is ready: it fills at the first Take. Its owner serializes Takes.
type Bucket struct{ l *rate.Limiter }

// Take takes a token under limit l at now, or says how long until one is there. An off limit
// always gives; a changed one applies from now.
func (b *Bucket) Take(l Limit, now time.Time) (ok bool, retryAfter time.Duration) {
	if l.Off() {
		return true, 0
	}
	if b.l == nil {
		b.l = rate.NewLimiter(rate.Limit(l.Rate), l.Burst)
	} else {
		adjust(b.l, l, now)
	}
	return take(b.l, now)
}

// adjust applies a limit changed live to a bucket.
func adjust(b *rate.Limiter, l Limit, now time.Time) {
	if b.Limit() != rate.Limit(l.Rate) || b.Burst() != l.Burst {
		b.SetLimitAt(now, rate.Limit(l.Rate))
		b.SetBurstAt(now, l.Burst)
	}
}

func take(l *rate.Limiter, now time.Time) (bool, time.Duration) {
	r := l.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // a refused call spends nothing
		return false, d
	}
	return true, 0
}

// Table holds a token bucket per key, each with the limit its caller names. Its size is
// bounded: a key whose bucket is full again is forgotten when room is needed (it is the same
// as a new one), and when every key is busy a quarter of them is dropped at random, so an
// attacker spraying keys (IPv6 addresses) costs memory up to Max and no more.
type Table[K comparable] struct {
	max int

	mu      sync.Mutex // guards the fields below
	buckets map[K]*rate.Limiter
	evicted uint64
}

// NewTable returns a table of at most size keys (at least 16).
func NewTable[K comparable](size int) *Table[K] {
	return &Table[K]{max: max(size, 16), buckets: make(map[K]*rate.Limiter)}
}

// Take takes a token from key's bucket under limit l at now, or says how long until one is
// there. An off limit always gives and keeps nothing.
func (t *Table[K]) Take(key K, l Limit, now time.Time) (ok bool, retryAfter time.Duration) {
	if l.Off() {
		return true, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buckets[key]
	switch {
	case b == nil:
		if len(t.buckets) >= t.max {
			t.makeRoom(now)
		}
		b = rate.NewLimiter(rate.Limit(l.Rate), l.Burst)
		t.buckets[key] = b
	default:
		adjust(b, l, now)
	}
	return take(b, now)
}

// makeRoom forgets keys whose bucket is full, then, if that freed less than a quarter, drops
// keys at random until a quarter is free. Caller holds mu.
func (t *Table[K]) makeRoom(now time.Time) {
	for k, b := range t.buckets {
		if b.TokensAt(now) >= float64(b.Burst()) {
			delete(t.buckets, k)
		}
	}
	for k := range t.buckets { // map order is random enough for this
		if len(t.buckets) <= t.max*3/4 {
			break
		}
		delete(t.buckets, k)
		t.evicted++
	}
}

// Len returns the number of keys kept.
func (t *Table[K]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.buckets)
}

// Evicted returns how many busy keys were dropped to bound the table.
func (t *Table[K]) Evicted() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evicted
}
