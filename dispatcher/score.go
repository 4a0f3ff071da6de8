package dispatcher

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Weights are the points each scoring input is worth; docs/dispatch.md explains them. A node's
// score is its locality (region and ISP points, fixed for a client) plus its quality (the load
// terms, each a fraction in [0, 1] times its weight). With the defaults the region tiers are
// 100 points apart and ISP plus every load term together are worth 95, so a nearer node always
// ranks above a farther one while it has capacity, and a same-ISP node above a cross-ISP one in
// the same tier.
type Weights struct {
	// Region match: the client's subdivision (province, state), country or continent.
	SameSubdivision float64 `json:"same_subdivision"`
	SameCountry     float64 `json:"same_country"`
	SameContinent   float64 `json:"same_continent"`
	// SameISP is added when the node is reached through the client's ISP (or an equivalent one).
	SameISP float64 `json:"same_isp"`
	// SpareConnections times the fraction of the node's connection capacity that is free,
	// counting the clients dispatched to it since its last report.
	SpareConnections float64 `json:"spare_connections"`
	// SpareEgress times the fraction of egress bandwidth that is free (one half when the node
	// does not report a capacity).
	SpareEgress float64 `json:"spare_egress"`
	// FlowControl times (1 - flow-control strength).
	FlowControl float64 `json:"flow_control"`
	// CPU times the idle fraction of the node's CPU.
	CPU float64 `json:"cpu"`
	// Link times the link quality, 1 / (1 + busRTT / LinkRTT), busRTT rounded to 5 ms
	// steps (one half when not reported).
	Link float64 `json:"link"`
}

// DefaultWeights returns the weights used when Config.Weights is the zero value.
func DefaultWeights() Weights {
	return Weights{
		SameSubdivision: 300, SameCountry: 200, SameContinent: 100,
		SameISP:          50,
		SpareConnections: 20, SpareEgress: 10, FlowControl: 5, CPU: 5, Link: 5,
	}
}

func (w Weights) validate() error {
	for _, v := range []float64{w.SameSubdivision, w.SameCountry, w.SameContinent, w.SameISP,
		w.SpareConnections, w.SpareEgress, w.FlowControl, w.CPU, w.Link} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e6 {
			return fmt.Errorf("dispatcher: weights must be between 0 and 1e6, got %+v", w)
		}
	}
	if w.SameSubdivision < w.SameCountry || w.SameCountry < w.SameContinent {
		return errors.New("dispatcher: weights must rank the same subdivision >= same country >= same continent")
	}
	return nil
}

func (w Weights) locality(level matchLevel, sameISP bool) float64 {
	var p float64
	switch level {
	case matchSubdivision:
		p = w.SameSubdivision
	case matchCountry:
		p = w.SameCountry
	case matchContinent:
		p = w.SameContinent
	case matchFar:
		p = -maxNear * w.nearGap()
	default:
		if level >= matchNear {
			p = -float64(level-matchNear) * w.nearGap()
		}
	}
	if sameISP {
		p += w.SameISP
	}
	return p
}

// nearGap is the points between two regions of a near-region list (Config.NearRegions): the
// first scores as "elsewhere" (0), each next one nearGap less, and the nodes on none of it
// maxNear gaps less. It is the continent tier's points, or more when the same ISP and every
// load term together are worth more, so a nearer region of the list always ranks first.
func (w Weights) nearGap() float64 {
	return max(w.SameContinent, w.SameISP+w.SpareConnections+w.SpareEgress+w.FlowControl+w.CPU+w.Link)
}

// fullPenalty is subtracted from the score of a node without capacity, so that every node with
// capacity ranks above it whatever its locality; full nodes are still returned, best first,
// when nothing else is left.
const fullPenalty = 1e9

// minWarmShare is the share of its capacity a node in slow start gets at once.
const minWarmShare = 0.05

// nodeSnap is a node's latest accepted report with what scoring derives from it. Immutable;
// each report replaces it.
type nodeSnap struct {
	report    *reportView
	endpoint  Endpoint
	region    region
	isps      []uint32 // canonical ISP keys, interned
	isp0      uint32   // isps[0], or 0
	isp1      uint32   // isps[1], or 0
	pool      uint32   // the pool label, interned with poolPrefix; 0: none
	regionErr string   // why the region label was ignored

	capacity         float64 // max connections; Config.DefaultCapacity when not reported
	capacityReported bool
	conns            float64
	egress           float64 // bytes per second
	egressCap        float64 // 0: not reported
	egressPerConn    float64 // to predict the egress of dispatched clients
	strength, cpu    float64 // clamped to [0, 1]
	link             float64 // [0, 1]

	draining   bool
	static     float64 // the quality terms that do not move between reports
	staticFull bool    // flow control or CPU at their limit
	invCap     float64 // 1 / capacity
	invEgress  float64 // 1 / egressCap, or 0

	staleAfter int64 // ns without a report after which the node is out
	warmFrom   int64 // start of its slow start (unix ns); 0: none
}

// reportView is the part of a report kept for the admin view.
type reportView struct {
	Connections       int64   `json:"connections"`
	MaxConnections    int64   `json:"max_connections"`
	Rooms             int64   `json:"rooms"`
	EgressBytesPerSec int64   `json:"egress_bytes_per_sec"`
	EgressCapacity    int64   `json:"egress_capacity_bytes_per_sec"`
	FlowControl       float64 `json:"flow_control_strength"`
	CPU               float64 `json:"cpu"`
	BusRTTUs          int64   `json:"bus_rtt_us"`
	ReportIntervalMs  int64   `json:"report_interval_ms"`
	Draining          bool    `json:"draining"`
	Region            string  `json:"region"`
	ISP               string  `json:"isp"`
	Pool              string  `json:"pool,omitempty"`
	// The node's deliveries and drops per lane since it started; not scored.
	Lanes []laneView `json:"lanes,omitempty"`
}

// nodeLoad is a node's live quality: its report plus what was dispatched to it since.
type nodeLoad struct {
	share       float64 // slow-start share of capacity
	predicted   float64 // connections
	spareConns  float64
	spareEgress float64
	full        bool
	quality     float64
}

// slowStartShare is the fraction of its capacity a node may fill at now: it grows linearly
// from minWarmShare to 1 over the window.
func (d *Dispatcher) slowStartShare(s *nodeSnap, now int64) float64 {
	if s.warmFrom == 0 || d.cfg.SlowStart <= 0 {
		return 1
	}
	f := float64(now-s.warmFrom) / float64(d.cfg.SlowStart)
	if f >= 1 {
		return 1
	}
	return minWarmShare + (1-minWarmShare)*max(f, 0)
}

// load scores a node's quality at now, counting assigned clients dispatched since its report.
func (d *Dispatcher) load(s *nodeSnap, assigned int64, now int64) nodeLoad {
	w := &d.cfg.Weights
	l := nodeLoad{share: d.slowStartShare(s, now)}
	a := float64(assigned)
	l.predicted = s.conns + a
	capacity := s.capacity * l.share
	l.spareConns = clamp01(1 - l.predicted/capacity)
	l.full = l.predicted >= capacity || s.strength >= 1 || s.cpu >= d.cfg.CPUFull
	if s.egressCap > 0 {
		egress := s.egress + a*s.egressPerConn
		l.spareEgress = clamp01(1 - egress/s.egressCap)
		l.full = l.full || egress >= s.egressCap
	} else {
		l.spareEgress = 0.5
	}
	l.quality = w.SpareConnections*l.spareConns + w.SpareEgress*l.spareEgress +
		w.FlowControl*(1-s.strength) + w.CPU*(1-s.cpu) + w.Link*s.link
	return l
}

// liveScore is load(...).score(locality) without the parts only the admin view needs: it runs
// for every candidate of every decision.
func (d *Dispatcher) liveScore(s *nodeSnap, assigned, now int64, locality float64) float64 {
	a := float64(assigned)
	var spare float64
	if s.warmFrom == 0 {
		spare = 1 - (s.conns+a)*s.invCap
	} else {
		spare = 1 - (s.conns+a)*s.invCap/d.slowStartShare(s, now)
	}
	full := spare <= 0 || s.staticFull
	q := locality + s.static + d.cfg.Weights.SpareConnections*clamp01(spare)
	if s.invEgress > 0 {
		e := 1 - (s.egress+a*s.egressPerConn)*s.invEgress
		full = full || e <= 0
		q += d.cfg.Weights.SpareEgress * clamp01(e)
	}
	if full {
		q -= fullPenalty
	}
	return q
}

// score is a node's total for a client whose locality points for it are locality.
func (l nodeLoad) score(locality float64) float64 {
	if l.full {
		return locality + l.quality - fullPenalty
	}
	return locality + l.quality
}

// linkQuality maps a bus round trip to [0, 1]: 1/2 at ref, near 1 well below it.
// linkRTTStep is the resolution of bus round trips in the link quality.
const linkRTTStep = 5 * time.Millisecond

func linkQuality(rtt, ref time.Duration) float64 {
	if rtt <= 0 {
		return 0.5
	}
	// Round to 5 ms steps: below that a round trip's jitter says nothing about the link, and it
	// must not outweigh the clients just sent to a node.
	rtt = rtt.Round(linkRTTStep)
	return 1 / (1 + float64(rtt)/float64(ref))
}

func clamp01(v float64) float64 {
	switch {
	case v < 0 || math.IsNaN(v):
		return 0
	case v > 1:
		return 1
	}
	return v
}
