package chatlink

import (
	"testing"
	"time"
)

// offered is a load in bytes per second per lane: critical, normal, bulk.
type offered struct{ critical, normal, bulk float64 }

// simulate feeds the controller one second at a time with what the node would send at the
// current strength, and returns each second's usage, strength and critical bytes sent.
func simulate(f *flowController, start time.Time, total *uint64, load offered, seconds int) (usage, strength []float64, critical float64) {
	now := start
	for i := 0; i < seconds; i++ {
		keepNormal, keepBulk := keepFractions(f.strength())
		sent := load.critical + load.normal*keepNormal + load.bulk*keepBulk
		critical += load.critical
		*total += uint64(sent)
		now = now.Add(time.Second)
		u, s := f.observe(now, *total)
		usage, strength = append(usage, u), append(strength, s)
	}
	return usage, strength, critical
}

func TestFlowControlSettlesBetweenThresholds(t *testing.T) {
	t.Parallel()
	const capacity = 100e6 // 100 MB/s
	for _, mix := range []struct {
		name string
		load offered // as shares of the offered total
	}{
		{"mostly bulk", offered{0.1, 0.3, 0.6}},
		{"mostly normal", offered{0.1, 0.7, 0.2}},
		{"bulk only", offered{0, 0, 1}},
	} {
		t.Run(mix.name, func(t *testing.T) {
			f := newFlowController(capacity, 0.70, 0.85)
			start := time.Unix(1_700_000_000, 0)
			var total uint64
			f.observe(start, total)
			over := offered{1.5 * capacity * mix.load.critical, 1.5 * capacity * mix.load.normal, 1.5 * capacity * mix.load.bulk}
			usage, strength, _ := simulate(f, start, &total, over, 60)
			for sec := 10; sec < 60; sec++ { // within 10 s, and from then on
				if u := usage[sec-1]; u < 0.70 || u > 0.85 {
					t.Fatalf("second %d: usage %.3f outside [0.70, 0.85] (strength %.3f); usage so far %.2f", sec, u, strength[sec-1], usage[:sec])
				}
			}

			// The load falls to half the capacity: flow control lets go completely.
			under := offered{over.critical / 3, over.normal / 3, over.bulk / 3}
			_, strength, _ = simulate(f, start.Add(60*time.Second), &total, under, 20)
			if s := strength[len(strength)-1]; s != 0 {
				t.Fatalf("strength %.3f at half load, want 0", s)
			}
		})
	}
}

func TestKeepFractionsNeverTouchCritical(t *testing.T) {
	t.Parallel()
	prevN, prevB := 2.0, 2.0
	for s := 0.0; s <= 1.0; s += 0.05 {
		n, b := keepFractions(s)
		if n < 0 || n > 1 || b < 0 || b > 1 || n > prevN || b > prevB || b > n {
			t.Fatalf("strength %.2f: keep normal %.2f bulk %.2f (previous %.2f %.2f)", s, n, b, prevN, prevB)
		}
		prevN, prevB = n, b
	}
	if n, b := keepFractions(0); n != 1 || b != 1 {
		t.Fatalf("at strength 0 everything is kept, got %.2f %.2f", n, b)
	}
	if n, b := keepFractions(1); n != 0 || b != 0 {
		t.Fatalf("at strength 1 only critical is kept, got %.2f %.2f", n, b)
	}
}

func TestFlowControlDisabledWithoutCapacity(t *testing.T) {
	t.Parallel()
	f := newFlowController(0, 0.70, 0.85)
	start := time.Unix(1_700_000_000, 0)
	var total uint64
	f.observe(start, 0)
	if _, strength, _ := simulate(f, start, &total, offered{1e9, 1e9, 1e9}, 5); strength[4] != 0 {
		t.Fatalf("strength %.2f without a capacity", strength[4])
	}
}
