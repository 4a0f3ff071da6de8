package dispatcher

import (
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/buspb"
)

// node is one ChatLink the dispatcher knows. Its report is replaced whole on each load report;
// assigned counts the clients dispatched to it since that report, which is what lets a burst
// of dispatches between two reports spread out.
type node struct {
	name      string
	snap      atomic.Pointer[nodeSnap]
	assigned  atomic.Int64
	seen      atomic.Int64 // unix ns of the last report
	removed   atomic.Bool  // taken out of the registry; cached rankings must skip it
	decisions prometheus.Counter
	// slot is the node's small number while it is in the registry, the index of its locality
	// class in a ranking (ranking.classOf); a node that is out gives it back for a new one.
	slot uint32

	// Room affinity (rooms.go). reportGen counts the node's reports: room counts of an older
	// report count nothing.
	reportGen atomic.Uint64
	heldRooms []uint64   // the rooms its last report listed (roomTable.hash); guarded by Dispatcher.mu
	roomsMu   sync.Mutex // guards sentRooms
	sentRooms []uint64   // rooms it got members of since its report, not listed in it
}

// stale says whether the node has missed its reports at now.
func (n *node) stale(s *nodeSnap, now int64) bool { return now-n.seen.Load() > s.staleAfter }

// errReport is why a load report was dropped; its text labels a metric.
type errReport string

func (e errReport) Error() string { return string(e) }

const (
	rejectUnparseable errReport = "unparseable"
	rejectName        errReport = "bad_name"
	rejectURL         errReport = "bad_url"
	rejectNegative    errReport = "negative"
	rejectNotFinite   errReport = "not_finite"
	rejectRooms       errReport = "bad_rooms" // a room name that is not valid, or too many rooms
	rejectPool        errReport = "bad_pool"  // a pool label that is not a valid name
)

// maxRoomsHeld bounds the rooms a report may list: ChatLinks list at most 1,000; more is a
// report the dispatcher refuses rather than a cost it pays every second.
const maxRoomsHeld = 10_000

// checkReport refuses reports a node cannot have meant. Out-of-range fractions are clamped
// later; a capacity of 0 means "not reported".
func checkReport(r *buspb.LoadReport) error {
	if !auth.ValidName(r.Node) {
		return rejectName
	}
	if r.Pool != "" && !auth.ValidName(r.Pool) {
		// Refused rather than ignored: a node meant for a pool must not serve everyone.
		return rejectPool
	}
	u, err := url.Parse(r.WsUrl)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return rejectURL
	}
	if r.TcpAddr != "" {
		if _, _, err := net.SplitHostPort(r.TcpAddr); err != nil {
			return rejectURL
		}
	}
	for _, f := range []float64{r.FlowControlStrength, r.Cpu} {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return rejectNotFinite
		}
		if f < 0 {
			return rejectNegative
		}
	}
	for _, v := range []int64{r.Connections, r.Rooms, r.EgressBytesPerSec, r.EgressCapacityBytesPerSec,
		r.MaxConnections, r.BusRttUs, r.ReportIntervalMs} {
		if v < 0 {
			return rejectNegative
		}
	}
	if len(r.RoomsHeld) > maxRoomsHeld {
		return rejectRooms
	}
	for _, rc := range r.RoomsHeld {
		if !auth.ValidName(rc.App) || !auth.ValidName(rc.Room) {
			return rejectRooms
		}
		if rc.Members < 0 {
			return rejectNegative
		}
	}
	return nil
}

func (d *Dispatcher) onReport(msg *nats.Msg) {
	var r buspb.LoadReport
	err := proto.Unmarshal(msg.Data, &r)
	if err != nil {
		err = rejectUnparseable
	} else {
		err = checkReport(&r)
	}
	if err != nil {
		d.m.reports.WithLabelValues(err.Error()).Inc()
		d.log.Warn("dropping load report", "node", r.Node, "reason", err.Error())
		return
	}
	d.m.reports.WithLabelValues("ok").Inc()
	d.accept(&r)
}

// accept records a valid report.
func (d *Dispatcher) accept(r *buspb.LoadReport) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[r.Node]
	var prev *nodeSnap
	if n != nil {
		prev = n.snap.Load()
	} else {
		n = &node{name: r.Node, decisions: d.m.nodeDecisions.WithLabelValues(r.Node), slot: d.takeSlot()}
		d.nodes[r.Node] = n
	}
	s := d.snapOf(r, now)
	// Slow start for a node that has just joined, came back after missing its reports, or
	// stopped draining; not for the nodes already serving when the dispatcher itself starts.
	returning := prev == nil || n.stale(prev, now) || (prev.draining && !r.Draining)
	switch {
	case returning && now-d.started > int64(d.initialGrace):
		s.warmFrom = now
	case !returning && prev != nil:
		s.warmFrom = prev.warmFrom
	}
	if s.regionErr != "" && (prev == nil || prev.regionErr != s.regionErr) {
		d.log.Warn("node region label ignored", "node", r.Node, "err", s.regionErr)
	}
	membership := prev == nil || returning || prev.draining != r.Draining ||
		prev.region != s.region || !slices.Equal(prev.isps, s.isps) || prev.pool != s.pool
	n.snap.Store(s)
	n.assigned.Store(0)
	n.seen.Store(now)
	if d.roomAffinity() {
		d.roomsReported(n, r)
	}
	if membership {
		d.publishLive()
	}
}

// snapOf derives what scoring needs from a valid report.
func (d *Dispatcher) snapOf(r *buspb.LoadReport, now int64) *nodeSnap {
	s := &nodeSnap{
		report: &reportView{
			Connections: r.Connections, MaxConnections: r.MaxConnections, Rooms: r.Rooms,
			EgressBytesPerSec: r.EgressBytesPerSec, EgressCapacity: r.EgressCapacityBytesPerSec,
			FlowControl: r.FlowControlStrength, CPU: r.Cpu, BusRTTUs: r.BusRttUs,
			ReportIntervalMs: r.ReportIntervalMs, Draining: r.Draining, Region: r.Region, ISP: r.Isp, Pool: r.Pool,
			Lanes: lanesView(r.Lanes),
		},
		endpoint:         Endpoint{Node: r.Node, WSURL: r.WsUrl, TCPAddr: r.TcpAddr, TCPTLS: r.TcpTls},
		capacity:         float64(r.MaxConnections),
		capacityReported: r.MaxConnections > 0,
		conns:            float64(r.Connections),
		egress:           float64(r.EgressBytesPerSec),
		egressCap:        float64(r.EgressCapacityBytesPerSec),
		strength:         min(r.FlowControlStrength, 1),
		cpu:              min(r.Cpu, 1),
		link:             linkQuality(time.Duration(r.BusRttUs)*time.Microsecond, d.cfg.LinkRTT),
		staleAfter:       int64(d.cfg.StaleAfter),
	}
	if !s.capacityReported {
		s.capacity = float64(d.cfg.DefaultCapacity)
	}
	s.draining = r.Draining
	s.invCap = 1 / s.capacity
	w := &d.cfg.Weights
	s.static = w.FlowControl*(1-s.strength) + w.CPU*(1-s.cpu) + w.Link*s.link
	if s.egressCap > 0 {
		s.invEgress = 1 / s.egressCap
	} else {
		s.static += w.SpareEgress * 0.5
	}
	s.staticFull = s.strength >= 1 || s.cpu >= d.cfg.CPUFull
	if r.Connections > 0 {
		s.egressPerConn = s.egress / s.conns
	}
	if iv := r.ReportIntervalMs; iv > 0 {
		// Three missed reports, plus half an interval for jitter.
		iv = min(max(iv, 100), 60_000)
		s.staleAfter = int64(time.Duration(iv)*time.Millisecond*7) / 2
	}
	reg, err := parseRegion(d.in, r.Region)
	if err != nil {
		s.regionErr = err.Error()
	}
	s.region = reg
	if r.Pool != "" {
		s.pool = d.in.id(poolPrefix + r.Pool)
	}
	for _, k := range d.isps.nodeKeys(r.Isp) {
		s.isps = append(s.isps, d.in.id(k))
	}
	if len(s.isps) > 0 {
		s.isp0 = s.isps[0]
	}
	if len(s.isps) > 1 {
		s.isp1 = s.isps[1]
	}
	return s
}

// takeSlot returns a free node slot: one a node that went out gave back, else a new one.
// Caller holds mu.
func (d *Dispatcher) takeSlot() uint32 {
	if n := len(d.freeSlots); n > 0 {
		slot := d.freeSlots[n-1]
		d.freeSlots = d.freeSlots[:n-1]
		return slot
	}
	return d.slots.Add(1) - 1
}

// publishLive marks the list of nodes that take clients for rebuilding and invalidates cached
// rankings. The list itself is rebuilt by the next ranking, so a thousand nodes joining at once
// cost one rebuild rather than a thousand. Caller holds mu.
func (d *Dispatcher) publishLive() {
	d.liveDirty.Store(true)
	d.gen.Add(1)
}

// liveSet is the nodes that take clients, in name order (so rankings of equal nodes are
// reproducible), with their labels copied side by side: ranking reads every node's labels,
// and a flat array of them stays in cache where a thousand node snapshots would not.
// Labels can only change with a membership change, which rebuilds the set.
type liveSet struct {
	nodes  []*node
	labels []nodeLabels
	index  []int32 // by node slot, the node's index in nodes; -1 for a node not in the set
}

type nodeLabels struct {
	region     region
	isp0, isp1 uint32
	moreISPs   bool   // the snapshot has more than two ISP keys
	pool       uint32 // the reserved pool the node is in (its label, when reserved), 0 for none
}

// liveNodes returns the current live set, rebuilding it after a membership change.
func (d *Dispatcher) liveNodes() *liveSet {
	if d.liveDirty.Load() {
		d.mu.Lock()
		if d.liveDirty.Load() {
			live := &liveSet{nodes: make([]*node, 0, len(d.nodes))}
			for _, n := range d.nodes {
				if !n.snap.Load().draining {
					live.nodes = append(live.nodes, n)
				}
			}
			slices.SortFunc(live.nodes, func(a, b *node) int { return strings.Compare(a.name, b.name) })
			live.labels = make([]nodeLabels, len(live.nodes))
			pools := d.pools.Load()
			live.index = make([]int32, d.slots.Load())
			for i := range live.index {
				live.index[i] = -1
			}
			for i, n := range live.nodes {
				s := n.snap.Load()
				live.labels[i] = s.labels()
				live.labels[i].pool = pools.nodePool(s.pool)
				live.index[n.slot] = int32(i)
			}
			d.live.Store(live)
			d.liveDirty.Store(false)
		}
		d.mu.Unlock()
	}
	return d.live.Load()
}

// sweep takes out the nodes that missed their reports.
func (d *Dispatcher) sweep(now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for name, n := range d.nodes {
		if n.stale(n.snap.Load(), now) {
			delete(d.nodes, name)
			n.removed.Store(true)
			d.roomsRemoved(n)
			d.freeSlots = append(d.freeSlots, n.slot)
			d.m.nodeDecisions.DeleteLabelValues(name)
			d.log.Info("node is out: no load report in time", "node", name)
			changed = true
		}
	}
	if changed {
		d.publishLive()
	}
}

// LiveNodes counts the nodes that reported in time, draining ones included.
func (d *Dispatcher) LiveNodes() int {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	count := 0
	for _, n := range d.nodes {
		if !n.stale(n.snap.Load(), now) {
			count++
		}
	}
	return count
}

// laneView is one lane's counts in a report (LaneCounters), the lane by name.
type laneView struct {
	Lane             string `json:"lane"`
	Deliveries       int64  `json:"deliveries"`
	DropsBudget      int64  `json:"drops_budget"`
	DropsFlowControl int64  `json:"drops_flow_control"`
	DropsSlowReader  int64  `json:"drops_slow_reader"`
}

func lanesView(lanes []*buspb.LaneCounters) []laneView {
	out := make([]laneView, len(lanes))
	for i, l := range lanes {
		out[i] = laneView{
			Lane: strings.ToLower(strings.TrimPrefix(l.Lane.String(), "LANE_")), Deliveries: l.Deliveries,
			DropsBudget: l.DropsBudget, DropsFlowControl: l.DropsFlowControl, DropsSlowReader: l.DropsSlowReader,
		}
	}
	return out
}

// NodeInfo is one node in the admin view: its labels, its last report and the inputs of its
// score.
type NodeInfo struct {
	Node        string `json:"node"`
	WSURL       string `json:"ws_url"`
	TCPAddr     string `json:"tcp_addr"`
	Region      string `json:"region"`
	RegionError string `json:"region_error,omitempty"`
	// Pool is the node's pool label; Reserved says a reservation names it (Config.Pools), so
	// the node takes that app's or room's clients and no one else's.
	Pool         string      `json:"pool,omitempty"`
	Reserved     bool        `json:"reserved,omitempty"`
	ISPs         []string    `json:"isps"`
	Draining     bool        `json:"draining"`
	Stale        bool        `json:"stale"`
	ReportAgeMs  int64       `json:"report_age_ms"`
	Report       *reportView `json:"report"`
	Capacity     int64       `json:"capacity"`
	CapacityNote string      `json:"capacity_note,omitempty"`
	// Assigned counts the clients dispatched to the node since its report; Predicted adds
	// them to its reported connections.
	Assigned       int64   `json:"assigned_since_report"`
	Predicted      int64   `json:"predicted_connections"`
	SlowStartShare float64 `json:"slow_start_share"`
	SpareConns     float64 `json:"spare_connections"`
	SpareEgress    float64 `json:"spare_egress"`
	Link           float64 `json:"link_quality"`
	Full           bool    `json:"full"`
	Quality        float64 `json:"quality"`
	// With a client (GET /v1/nodes?ip=...): how near the node is and its total score.
	Match   string   `json:"match,omitempty"`
	SameISP *bool    `json:"same_isp,omitempty"`
	Score   *float64 `json:"score,omitempty"`
}

// Nodes describes every node the dispatcher knows, best first for client when client is a
// valid address, else by name.
func (d *Dispatcher) Nodes(client netip.Addr) []NodeInfo {
	now := d.now()
	loc := d.locate(client)
	pools := d.pools.Load()
	d.mu.Lock()
	nodes := make([]*node, 0, len(d.nodes))
	for _, n := range d.nodes {
		nodes = append(nodes, n)
	}
	d.mu.Unlock()
	out := make([]NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		s := n.snap.Load()
		assigned := n.assigned.Load()
		l := d.load(s, assigned, now)
		info := NodeInfo{
			Node: n.name, WSURL: s.endpoint.WSURL, TCPAddr: s.endpoint.TCPAddr,
			Region: regionLabel(d.in, s.region), RegionError: s.regionErr, ISPs: []string{},
			Draining: s.draining, Stale: n.stale(s, now), ReportAgeMs: (now - n.seen.Load()) / 1e6,
			Report: s.report, Capacity: int64(s.capacity), Assigned: assigned, Predicted: int64(l.predicted),
			SlowStartShare: l.share, SpareConns: l.spareConns, SpareEgress: l.spareEgress, Link: s.link,
			Full: l.full, Quality: l.quality,
		}
		if s.pool != 0 {
			info.Pool, info.Reserved = s.report.Pool, pools.nodePool(s.pool) != 0
		}
		if !s.capacityReported {
			info.CapacityNote = "not reported: the dispatcher's default capacity"
		}
		for _, id := range s.isps {
			info.ISPs = append(info.ISPs, d.in.name(id))
		}
		if client.IsValid() {
			level, same := loc.level(s.region), loc.matchesISP(s)
			score := l.score(d.cfg.Weights.locality(level, same))
			info.Match, info.SameISP, info.Score = level.String(), &same, &score
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int {
		if a.Score != nil && *a.Score != *b.Score {
			if *a.Score > *b.Score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out
}

// matchesISP says whether a node with snapshot s is reached through the client's ISP.
func (l location) matchesISP(s *nodeSnap) bool {
	nl := s.labels()
	return l.matchesLabels(&nl, s)
}

// labels copies what locality is computed from.
func (s *nodeSnap) labels() nodeLabels {
	return nodeLabels{region: s.region, isp0: s.isp0, isp1: s.isp1, moreISPs: len(s.isps) > 2}
}

// matchesLabels is matchesISP from a node's copied labels; s is read only for nodes with more
// than two ISP keys.
func (l location) matchesLabels(nl *nodeLabels, s *nodeSnap) bool {
	if l.ispA == 0 && l.ispB == 0 {
		return false
	}
	if nl.isp0 != 0 && (nl.isp0 == l.ispA || nl.isp0 == l.ispB) || nl.isp1 != 0 && (nl.isp1 == l.ispA || nl.isp1 == l.ispB) {
		return true
	}
	if nl.moreISPs {
		for _, k := range s.isps[2:] {
			if k == l.ispA || k == l.ispB {
				return true
			}
		}
	}
	return false
}

// class is a node's locality class for a client at l (numClasses): its match level times two,
// plus one when it shares the client's ISP. s is read only for nodes with more than two ISP keys.
func (l location) class(nl *nodeLabels, s *nodeSnap) uint8 {
	c := uint8(l.level(nl.region)) * 2
	if l.matchesLabels(nl, s) {
		c++
	}
	return c
}

// snapForMore returns n's snapshot when matching needs it (more than two ISP keys), else nil.
func (nl *nodeLabels) snapForMore(n *node) *nodeSnap {
	if nl.moreISPs {
		return n.snap.Load()
	}
	return nil
}
