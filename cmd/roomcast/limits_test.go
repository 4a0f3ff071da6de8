package main

import (
	"flag"
	"io"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/ratelimit"
)

// defaultLimits is the ChatLink's limits as the flags leave them when none is given.
func defaultLimits(t *testing.T) chatlink.Limits {
	t.Helper()
	fs := flag.NewFlagSet("chatlink", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	apply := bindClientLimitFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var c chatlink.Config
	apply(&c)
	return c.Limits
}

// TestDefaultLimitsLetABigRoomIn: with the default limits on, a 60,000-member room joining
// over a minute at 1,000/s on average (random arrivals, as a crowd comes) meets no refusal
// from the room's join rate, and a carrier-grade NAT address with a thousand of those viewers
// (arriving in the same minute, half of them in its first second) none from the per-address
// login rate; the per-address connections hold them all.
func TestDefaultLimitsLetABigRoomIn(t *testing.T) {
	t.Parallel()
	lim := defaultLimits(t)
	if lim.JoinsPerRoom.Off() || lim.LoginsPerIP.Off() || lim.ConnectionsPerIP == 0 {
		t.Fatalf("default limits %+v: joins per room, logins and connections per address should be on", lim)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rooms := ratelimit.NewTable[string](16)
	now, refused := start, 0
	for range 60000 {
		now = now.Add(time.Duration(rng.ExpFloat64() * float64(time.Millisecond)))
		if ok, _ := rooms.Take("big", lim.JoinsPerRoom, now); !ok {
			refused++
		}
	}
	if refused > 0 || now.Sub(start) > 70*time.Second {
		t.Errorf("60,000 joins over %v: %d refused by the default %v per room", now.Sub(start), refused, lim.JoinsPerRoom)
	}
	addrs := ratelimit.NewTable[netip.Addr](16)
	nat := netip.MustParseAddr("100.64.0.1")
	refused = 0
	// In time order: 500 in the first second, 500 over the next 59.
	times := make([]time.Time, 0, 1000)
	for range 500 {
		times = append(times, start.Add(time.Duration(rng.Int64N(int64(time.Second)))))
	}
	for i := range 500 {
		times = append(times, start.Add(time.Second+time.Duration(i)*59*time.Second/500))
	}
	slices.SortFunc(times, time.Time.Compare)
	for _, at := range times {
		if ok, _ := addrs.Take(nat, lim.LoginsPerIP, at); !ok {
			refused++
		}
	}
	if refused > 0 {
		t.Errorf("1,000 viewers behind one address: %d refused by the default %v per address", refused, lim.LoginsPerIP)
	}
	if lim.ConnectionsPerIP < 1000 {
		t.Errorf("the default %d connections per address does not hold 1,000 viewers behind one", lim.ConnectionsPerIP)
	}
}
