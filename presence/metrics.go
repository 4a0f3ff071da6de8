package presence

import (
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/buspb"
	"roomcast/internal/prom"
)

// metrics are the service's Prometheus instruments. Instances in one process (the dev
// assembly, tests) share one set: the first registers it, the others find it registered.
// Every instance holds the full view, so each sets the sessions gauge to the same count.
type metrics struct {
	logins, logouts prometheus.Counter // events published to the apps
	sessions        prometheus.Gauge
	leaseEmitted    prometheus.Counter
	leaseSkipped    prometheus.Counter
	webhookOK       prometheus.Counter
	webhookFailed   prometheus.Counter
	replaced        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	events := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_presence_events_total",
		Help: "Online (login) and offline (logout) events published to the apps, by kind; a lease end's logouts included.",
	}, []string{"kind"}))
	leaseEnds := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_presence_lease_end_logouts_total",
		Help: "Logouts of sessions whose ChatLink's lease ended, by result (emitted by this process, skipped: another instance claimed the node's end).",
	}, []string{"result"}))
	webhooks := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_presence_webhook_posts_total",
		Help: "Batches of presence events posted to the apps' webhooks, by result (ok, error).",
	}, []string{"result"}))
	return &metrics{
		logins:  events.WithLabelValues("login"),
		logouts: events.WithLabelValues("logout"),
		sessions: prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_presence_sessions", Help: "Sessions online in every app, as the presence service knows them.",
		})),
		leaseEmitted:  leaseEnds.WithLabelValues("emitted"),
		leaseSkipped:  leaseEnds.WithLabelValues("skipped"),
		webhookOK:     webhooks.WithLabelValues("ok"),
		webhookFailed: webhooks.WithLabelValues("error"),
		replaced: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_presence_replaced_sessions_total", Help: "Sessions closed (4010 REPLACED) by an app's device policy.",
		})),
	}
}

// countEvents counts the events published to the apps.
func (m *metrics) countEvents(evs []*buspb.SessionEvent) {
	for _, ev := range evs {
		if ev.Kind == buspb.SessionEvent_KIND_LOGOUT {
			m.logouts.Inc()
		} else {
			m.logins.Inc()
		}
	}
}
