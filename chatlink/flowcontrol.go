package chatlink

import (
	"math"
	"roomcast/proto/clientpb"
	"sync"
	"sync/atomic"
	"time"
)

// Node flow control, two thresholds. The node measures its egress against its capacity once a
// second. Below T1 nothing is held back and the strength relaxes; between T1 and T2 the strength
// holds; above T2 it strengthens, in steps that grow with the distance above T2. Strength in
// [0, 1] decides how much of bulk, then normal, is sampled away; critical is never touched.
// Steps are small near the band, so under a steady overload the usage settles inside [T1, T2]
// instead of swinging across both thresholds.
type flowController struct {
	capacity float64 // bytes per second; 0 disables flow control
	t1, t2   float64

	mu        sync.Mutex // guards the fields below
	lastAt    time.Time
	lastBytes uint64
	usage     float64

	strengthBits atomic.Uint64 // float64 bits; read on every flush without mu
}

// Controller gains: each second the strength moves by flowMinStep plus flowGain times the
// distance of the usage from the band.
const (
	flowGain    = 0.25
	flowMinStep = 0.02
)

func newFlowController(capacity, t1, t2 float64) *flowController {
	return &flowController{capacity: capacity, t1: t1, t2: t2}
}

// strength returns the current strength in [0, 1].
func (f *flowController) strength() float64 { return math.Float64frombits(f.strengthBits.Load()) }

// observe takes the egress byte counter's total at now and adjusts the strength from the usage
// since the previous observation. It returns the usage (egress / capacity) and the strength.
func (f *flowController) observe(now time.Time, totalBytes uint64) (usage, strength float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastAt.IsZero() || f.capacity <= 0 || !now.After(f.lastAt) {
		f.lastAt, f.lastBytes = now, totalBytes
		return f.usage, f.strength()
	}
	rate := float64(totalBytes-f.lastBytes) / now.Sub(f.lastAt).Seconds()
	f.lastAt, f.lastBytes = now, totalBytes
	f.usage = rate / f.capacity
	s := f.strength()
	switch {
	case f.usage > f.t2:
		s += flowMinStep + flowGain*(f.usage-f.t2)
	case f.usage < f.t1:
		s -= flowMinStep + flowGain*(f.t1-f.usage)
	}
	s = min(1, max(0, s))
	f.strengthBits.Store(math.Float64bits(s))
	return f.usage, s
}

// egressRate returns the last measured egress in bytes per second.
func (f *flowController) egressRate() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usage * f.capacity
}

// keepFractions maps a strength to the share of normal and bulk messages kept: the first half
// of the strength thins bulk away, the second half normal.
func keepFractions(strength float64) (normal, bulk float64) {
	bulk = min(1, max(0, 1-2*strength))
	normal = min(1, max(0, 2-2*strength))
	return normal, bulk
}

// Backlog levels of a connection, from the bytes written to it but not yet taken by its socket.
const (
	levelFull         = 0 // everything
	levelThin         = 1 // no bulk
	levelCriticalOnly = 2 // critical only
	levelClose        = 3 // even critical backs up: close
)

// backlogLevel returns c's backlog level.
func (n *Node) backlogLevel(c *conn) int {
	p := c.t.pending()
	switch {
	case p < int64(n.cfg.ThinAtPendingBytes):
		return levelFull
	case p < int64(n.cfg.CriticalOnlyAtPendingBytes):
		return levelThin
	case p < int64(n.cfg.MaxPendingBytes):
		return levelCriticalOnly
	}
	return levelClose
}

// levelFilter returns what a member at backlog level lvl still gets.
func levelFilter(lvl int) func(queued) bool {
	switch lvl {
	case levelThin:
		return func(q queued) bool { return lane(q.m) != clientpb.Lane_LANE_BULK }
	case levelCriticalOnly:
		return func(q queued) bool { return lane(q.m) == clientpb.Lane_LANE_CRITICAL }
	}
	return nil
}

// flowLoop observes the egress once a second.
func (n *Node) flowLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	n.flow.observe(time.Now(), n.egress.Load())
	for {
		select {
		case <-n.ctx.Done():
			return
		case now := <-t.C:
			usage, s := n.flow.observe(now, n.egress.Load())
			n.m.flowStrength.Set(s)
			n.m.egressUsage.Set(usage)
		}
	}
}
