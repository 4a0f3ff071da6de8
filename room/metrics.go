package room

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/bus"
	"roomcast/internal/prom"
	pb "roomcast/proto/roomcastpb"
)

// Requests the service answers, as its metrics name them.
const (
	opJoin = iota
	opSend
	opHistory
	numOps
)

var opNames = [numOps]string{"join", "send", "history"}

// metrics are the service's Prometheus instruments. Instances in one process (the dev
// assembly, tests) share one set: the first registers it, the others find it registered.
type metrics struct {
	requests *prometheus.CounterVec // by op and answer code
	latency  [numOps]prometheus.Observer
	messages prometheus.Counter  // messages broadcast
	batch    prometheus.Observer // messages per send request
}

func newMetrics(reg prometheus.Registerer) *metrics {
	requests := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_room_requests_total",
		Help: "Requests answered by the room service, by op (join, send, history) and answer code (OK, or the refusal's ERROR_CODE_*).",
	}, []string{"op", "code"}))
	latency := prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "roomcast_room_request_seconds",
		Help:    "Time from a request's arrival at the room service to its answer, by op (an app's callback included).",
		Buckets: prom.LatencyBuckets,
	}, []string{"op"}))
	m := &metrics{
		requests: requests,
		messages: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_room_messages_total", Help: "Messages the room service stamped and broadcast.",
		})),
		batch: prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "roomcast_room_send_batch_messages",
			Help:    "Messages per send request the room service took (a ChatLink's batch window or an API batch).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 100},
		})),
	}
	for op, name := range opNames {
		m.latency[op] = latency.WithLabelValues(name)
	}
	return m
}

// codeName is the metrics' name of an answer code.
func codeName(code uint32) string {
	if code == 0 {
		return "OK"
	}
	return pb.ErrorCode(code).String()
}

// respond answers a request of op that arrived at start, and counts it.
func (s *Service) respond(msg *nats.Msg, op int, start time.Time, rep *pb.Reply) {
	bus.Respond(s.log, msg, rep)
	s.m.requests.WithLabelValues(opNames[op], codeName(rep.GetCode())).Inc()
	s.m.latency[op].Observe(time.Since(start).Seconds())
}
