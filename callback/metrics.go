package callback

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the client's Prometheus metrics, each labelled by app and hook.
type metrics struct {
	decisions      *prometheus.CounterVec   // roomcast_callback_decisions_total{app,hook,decision}
	failures       *prometheus.CounterVec   // roomcast_callback_failures_total{app,hook,kind}
	latency        *prometheus.HistogramVec // roomcast_callback_duration_seconds{app,hook}
	state          *prometheus.GaugeVec     // roomcast_callback_breaker_state{app,hook}
	shortCircuited *prometheus.CounterVec   // roomcast_callback_short_circuited_total{app,hook}
	rejected       *prometheus.CounterVec   // roomcast_callback_rejected_total{app,hook,reason}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := []string{"app", "hook"}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_callback_decisions_total",
			Help: "Callback decisions: allow and deny (the app answered), fail_open and fail_closed (no answer: the failure policy decided).",
		}, append(labels, "decision")),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_callback_failures_total",
			Help: "Callback calls that got no usable answer, by kind: timeout, transport, status (not 200), bad_answer.",
		}, append(labels, "kind")),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roomcast_callback_duration_seconds",
			Help:    "Time of the callback calls made, from the request to the answer read (or the failure).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, labels),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "roomcast_callback_breaker_state",
			Help: "Each hook's circuit breaker: 0 closed, 1 half-open, 2 open.",
		}, labels),
		shortCircuited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_callback_short_circuited_total",
			Help: "Callbacks not made because the breaker was open (the failure policy decided).",
		}, labels),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_callback_rejected_total",
			Help: "Callbacks not made because of the concurrency limit (the failure policy decided): reason full (pool and queue full) or waited (longer than max_wait in the queue).",
		}, append(labels, "reason")),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.failures, m.latency, m.state, m.shortCircuited, m.rejected} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// endpointMetrics are the metrics of one app's hook, their labels bound.
type endpointMetrics struct {
	decisions, failures        *prometheus.CounterVec
	latency                    prometheus.Observer
	state                      prometheus.Gauge
	shortCircuited             prometheus.Counter
	rejectedFull, rejectedWait prometheus.Counter
}

func (m *metrics) forEndpoint(app string, hook Hook) endpointMetrics {
	l := prometheus.Labels{"app": app, "hook": string(hook)}
	return endpointMetrics{
		decisions:      m.decisions.MustCurryWith(l),
		failures:       m.failures.MustCurryWith(l),
		latency:        m.latency.With(l),
		state:          m.state.With(l),
		shortCircuited: m.shortCircuited.With(l),
		rejectedFull:   m.rejected.WithLabelValues(app, string(hook), "full"),
		rejectedWait:   m.rejected.WithLabelValues(app, string(hook), "waited"),
	}
}
