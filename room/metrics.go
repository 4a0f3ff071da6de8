package room

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/prom"
	"roomcast/proto/clientpb"
)

// Requests the service answers, as its metrics name them.
const (
	opJoin = iota
	opSend
	opHistory
	opModerate
	opAttributes
	opRecall
	numOps
)

var opNames = [numOps]string{"join", "send", "history", "moderate", "attributes", "recall"}

// metrics are an instance's instruments: the requests it answers and its way in. An instance
// restarted in the same process (roles.RestartRooms) counts on where its predecessor stopped.
type metrics struct {
	requests      *prometheus.CounterVec // by op and answer code
	ok            [numOps]okCounter      // requests' series for OK, looked up once
	latency       [numOps]prometheus.Observer
	sendBatch     prometheus.Observer // messages per send request
	batchMessages prometheus.Observer // messages per room batch published
	accepted      prometheus.Counter  // messages accepted (before the bulk cap)
	bulkSampled   prometheus.Counter  // bulk messages the room's cap left out
	batches       prometheus.Counter  // room batches published
	unsent        prometheus.Counter  // accepted messages whose publish failed
	demoted       prometheus.Counter  // members' critical messages sent on a lower lane

	counterWindows *prometheus.CounterVec // counter windows answered, by result
	counterWrites  prometheus.Counter     // writes of rooms' counter records
	counterDropped prometheus.Counter     // adds to new counters of rooms that had as many as they may
}

func newMetrics(reg prometheus.Registerer) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: "roomcast", Subsystem: "room", Name: name, Help: help}))
	}
	h := func(name, help string, buckets []float64) prometheus.Observer {
		return prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "roomcast", Subsystem: "room", Name: name, Help: help, Buckets: buckets}))
	}
	sizes := []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	latency := prom.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "roomcast_room_request_seconds",
		Help:    "Time from a request's arrival at the room service to its answer, by op (an app's callback included).",
		Buckets: prom.LatencyBuckets,
	}, []string{"op"}))
	m := &metrics{
		requests: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_room_requests_total",
			Help: "Requests answered by the room service, by op (join, send, history, moderate, attributes, recall) and answer code (OK, or the refusal's ERROR_CODE_*).",
		}, []string{"op", "code"})),
		sendBatch:     h("send_batch_messages", "Messages per send request the room service stamped together (a ChatLink's members' sends of one room and window that were admitted, up to 1000; 1 for a single API send; up to 100 for an API batch).", sizes),
		batchMessages: h("batch_window_messages", "Messages per room batch published to the rooms' nodes: what one batch window gathered.", sizes),
		accepted:      c("messages_accepted_total", "Messages the room service accepted for broadcast."),
		bulkSampled:   c("bulk_sampled_out_total", "Bulk messages left out by their room's bulk cap (RoomSettings.bulk_per_second) before the bus."),
		batches:       c("batches_published_total", "Room batches published to the rooms' nodes (one per room and batch window)."),
		unsent:        c("messages_unsent_total", "Accepted messages whose broadcast failed (bus down or closed): not delivered, not kept."),
		demoted:       c("messages_demoted_total", "Members' messages sent on a lower lane than they named: critical ones their room does not allow them (demote_critical), and the lanes the app's send callback lowered."),
		counterWindows: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_room_counter_windows_total",
			Help: "Counter windows (a ChatLink's sums of a room's counter adds, or the server API's resets) answered, by result: applied, duplicate (applied before), refused (malformed), unavailable (the store did not take them; the node sends them again).",
		}, []string{"result"})),
		counterWrites:  c("counter_writes_total", "Writes of rooms' counter records: one per room, tick and instance that had windows to apply."),
		counterDropped: c("counter_adds_dropped_total", "Sums of adds to a new counter of a room that already had as many counters as it may (ChatLinks that learned of each other's new names late)."),
	}
	for op, name := range opNames {
		m.latency[op] = latency.WithLabelValues(name)
	}
	return m
}

// okCounter is an op's series of requests answered OK, created at the first such answer (as
// a WithLabelValues at each would), then kept: the send path answers one a message.
type okCounter struct {
	once sync.Once
	c    prometheus.Counter
}

func (o *okCounter) inc(requests *prometheus.CounterVec, op int) {
	o.once.Do(func() { o.c = requests.WithLabelValues(opNames[op], "OK") })
	o.c.Inc()
}

// codeName is the metrics' name of an answer code.
func codeName(code uint32) string {
	if code == 0 {
		return "OK"
	}
	return clientpb.ErrorCode(code).String()
}

// respond answers a request of op that arrived at start, and counts it.
func (s *Service) respond(msg *nats.Msg, op int, start time.Time, rep *buspb.Reply) {
	bus.Respond(s.log, msg, rep)
	s.answered(bus.TraceparentOf(msg), op, start, rep)
}

// answered logs the answer to a traced request (traceparent tp) and counts it.
func (s *Service) answered(tp string, op int, start time.Time, rep *buspb.Reply) {
	if tp != "" && s.log.Enabled(context.Background(), slog.LevelDebug) {
		trace, _ := bus.TraceID(tp)
		s.log.Debug("request answered", "op", opNames[op], "code", codeName(rep.GetCode()), "trace_id", trace, "traceparent", tp)
	}
	if code := rep.GetCode(); code != 0 {
		s.metrics.requests.WithLabelValues(opNames[op], codeName(code)).Inc()
	} else {
		s.metrics.ok[op].inc(s.metrics.requests, op)
	}
	s.metrics.latency[op].Observe(time.Since(start).Seconds())
}
