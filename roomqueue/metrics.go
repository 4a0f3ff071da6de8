package roomqueue

import (
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/prom"
)

// metrics are the service's Prometheus metrics. Instances in one process (the dev assembly,
// tests) share one set: the first registers it, the others find it registered.
type metrics struct {
	requests   *prometheus.CounterVec // by op and answer code
	retries    prometheus.Counter     // compare-and-set rounds lost to another writer
	broadcasts prometheus.Counter     // changes whose event did not reach the room service
	dropped    prometheus.Counter     // entries taken out because their session ended
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_roomqueue_requests_total", Help: "Room queue requests served, by op and answer code (0: success).",
		}, []string{"op", "code"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_roomqueue_cas_retries_total", Help: "Room queue writes that lost the compare-and-set to another writer and were applied again.",
		}),
		broadcasts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_roomqueue_broadcast_failures_total", Help: "Room queue changes made whose rc.queue message did not reach the room service.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_roomqueue_dropped_entries_total", Help: "Room queue entries taken out because the session that offered them with drop_on_leave ended.",
		}),
	}
	m.requests = prom.Register(reg, m.requests)
	m.retries = prom.Register(reg, m.retries)
	m.broadcasts = prom.Register(reg, m.broadcasts)
	m.dropped = prom.Register(reg, m.dropped)
	return m
}
