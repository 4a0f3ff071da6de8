package dispatcher

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the dispatcher's Prometheus instruments. The hot path only touches counters
// resolved here or on the node, never a label lookup.
type metrics struct {
	decisions     prometheus.Counter
	noNodes       prometheus.Counter
	cacheHit      prometheus.Counter
	cacheMiss     prometheus.Counter
	nodeDecisions *prometheus.CounterVec // by node
	regionMatch   [len(matchNames)]prometheus.Counter
	ispMatch      [3]prometheus.Counter // ispSame, ispOther, ispUnknown
	clientAddr    [len(sourceNames)]prometheus.Counter
	reports       *prometheus.CounterVec // by result: ok or why it was rejected
	geoReloads    *prometheus.CounterVec // by db and result
	roomDecisions [numRoomResults]prometheus.Counter
	poolDecisions *prometheus.CounterVec // by pool and result, resolved per reservation
}

const (
	ispSame = iota
	ispOther
	ispUnknown
)

func newMetrics(reg prometheus.Registerer, liveNodes func() float64) *metrics {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_decisions_total",
		Help: "Dispatch requests, by result (ok, no_nodes).",
	}, []string{"result"})
	cache := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_cache_total",
		Help: "Ranking cache lookups per decision, by result (hit, miss).",
	}, []string{"result"})
	region := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_region_match_total",
		Help: "Decisions by how near the first node is to the client " +
			"(subdivision, country, continent, near: a region of the client's near-region list, elsewhere; " +
			"unknown: the client could not be located).",
	}, []string{"match"})
	isp := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_isp_match_total",
		Help: "Decisions by whether the first node shares the client's ISP (same, other; unknown: no ISP for the client).",
	}, []string{"match"})
	addr := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_client_address_total",
		Help: "Where each client's address came from (peer, forwarded, real_ip; " +
			"ignored_headers: forwarding headers from an untrusted peer; invalid: none usable).",
	}, []string{"source"})
	rooms := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_dispatcher_room_decisions_total",
		Help: "Decisions for clients of a room, by result (joined: a node holding the room; " +
			"opened: a node new to the room; overflow: every near node holds the room at its limit, or every node is full).",
	}, []string{"result"})
	m := &metrics{
		decisions: decisions.WithLabelValues("ok"),
		noNodes:   decisions.WithLabelValues("no_nodes"),
		cacheHit:  cache.WithLabelValues("hit"),
		cacheMiss: cache.WithLabelValues("miss"),
		nodeDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_dispatcher_node_decisions_total",
			Help: "Clients sent to each node as their first choice.",
		}, []string{"node"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_dispatcher_reports_total",
			Help: "Load reports received, by result (ok, or why they were dropped).",
		}, []string{"result"}),
		poolDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_dispatcher_pool_decisions_total",
			Help: "Decisions for clients of a room reserved for a pool, by pool and result (ok; no_nodes: no node of the pool was live and not draining, the client was refused).",
		}, []string{"pool", "result"}),
		geoReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_dispatcher_geo_reloads_total",
			Help: "GeoIP database reloads, by database (city, isp) and result (ok, error).",
		}, []string{"db", "result"}),
	}
	for i, name := range matchNames {
		m.regionMatch[i] = region.WithLabelValues(name)
	}
	for i, name := range []string{"same", "other", "unknown"} {
		m.ispMatch[i] = isp.WithLabelValues(name)
	}
	for i, name := range sourceNames {
		m.clientAddr[i] = addr.WithLabelValues(name)
	}
	for i, name := range roomResultNames {
		m.roomDecisions[i] = rooms.WithLabelValues(name)
	}
	if reg != nil {
		reg.MustRegister(decisions, cache, region, isp, addr, rooms, m.nodeDecisions, m.reports, m.geoReloads, m.poolDecisions,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "roomcast_dispatcher_nodes",
				Help: "Live ChatLinks known to the dispatcher (draining ones included).",
			}, liveNodes))
	}
	return m
}
