package cdnmanager

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/proto/clientpb"
)

// metrics are the manager's Prometheus instruments.
type metrics struct {
	changes *prometheus.CounterVec
	leader  atomic.Bool
}

func newMetrics(reg prometheus.Registerer, gauges func() (map[clientpb.CdnMode]int, int)) *metrics {
	m := &metrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_cdnmanager_assignment_changes_total",
			Help: "Rooms given to a pusher, by reason: new (entered CDN mode), lost (its pusher's lease ended), " +
				"handoff (its pusher left), rebalance (pushers came), off (left CDN mode).",
		}, []string{"reason"}),
	}
	for _, r := range []string{reasonNew, reasonLost, reasonHandoff, reasonRebalance, reasonOff} {
		m.changes.WithLabelValues(r)
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.changes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "roomcast_cdnmanager_leader",
			Help: "1 while this instance leads (decides modes and assignments).",
		}, func() float64 {
			if m.isLeader() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "roomcast_cdnmanager_pushers",
			Help: "Pushers live: reporting within the lease, not leaving, with the manager's window.",
		}, func() float64 { _, n := gauges(); return float64(n) }))
	for mode, label := range map[clientpb.CdnMode]string{clientpb.CdnMode_CDN_MODE_BULK: "bulk", clientpb.CdnMode_CDN_MODE_NORMAL_AND_BULK: "normal_and_bulk"} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "roomcast_cdnmanager_rooms",
			Help:        "Rooms in CDN mode, by mode.",
			ConstLabels: prometheus.Labels{"mode": label},
		}, func() float64 { byMode, _ := gauges(); return float64(byMode[mode]) }))
	}
	return m
}

func (m *metrics) setLeader(v bool) { m.leader.Store(v) }
func (m *metrics) isLeader() bool   { return m.leader.Load() }
