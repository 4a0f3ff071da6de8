// Package prom holds the Prometheus plumbing several components share: registering a
// collector that several instances in one process (the dev assembly, tests) share, and the
// latency buckets of the roles' histograms. It defines no metric of its own: each component
// names and owns its instruments.
package prom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Register registers c with reg, or returns the collector registered before it under the same
// name: instances of a component in one process share one set. A nil reg registers nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if errors.As(err, &dup) {
			if existing, ok := dup.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a name registered with another type or labels: a programming error
	}
	return c
}

// LatencyBuckets are the buckets, in seconds, of the roles' request latency histograms: 100µs
// (a cached decision) to 10s (a request that timed out).
var LatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// CounterValue reads a counter's current value, for a component that reports what its metrics
// already count (a ChatLink's load report) instead of counting it twice.
func CounterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
