package chatlink

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/prom"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// Reasons a message is not delivered to a member.
const (
	dropBudget      = iota // over the room's per-member budget
	dropFlowControl        // node flow control sampled it away
	dropSlowReader         // the member's write backlog is too long for its lane
	dropReasons
)

var dropReasonNames = [dropReasons]string{"budget", "flow_control", "slow_reader"}

// Requests a node makes over NATS, as its metrics name them.
const (
	busJoin = iota
	busSend
	busHistory
	busQueue
	busCounters
	busViewers
	busModerate
	busAttributes
	busRecall
	numBusOps
)

var busOpNames = [numBusOps]string{"join", "send", "history", "queue", "counters", "viewers", "moderate", "attributes", "recall"}

// metrics are a node's Prometheus instruments. Per-lane children are resolved once, so the
// fan-out adds to them without label lookups.
type metrics struct {
	connections        prometheus.Gauge
	rooms              prometheus.Gauge
	framesIn           *prometheus.CounterVec // by frame kind
	frameLogin         prometheus.Counter     // framesIn's children, resolved once: every
	frameSend          prometheus.Counter     // client frame counts in one
	frameHeartbeat     prometheus.Counter
	frameHistory       prometheus.Counter
	frameCounter       prometheus.Counter
	frameBad           prometheus.Counter
	pushFrames         prometheus.Counter
	ringSends          prometheus.Counter
	deliveries         [4]prometheus.Counter // by lane
	drops              [4][dropReasons]prometheus.Counter
	criticalOverBudget prometheus.Counter
	logins             *prometheus.CounterVec // by result
	loginSeconds       prometheus.Histogram
	recoveryReads      prometheus.Counter             // history reads made for recoveries (historyread.go)
	recoveryAskers     prometheus.Counter             // recoveries those reads served
	busSeconds         [numBusOps]prometheus.Observer // by op
	closes             *prometheus.CounterVec         // by close code name
	tlsSessions        *prometheus.CounterVec         // TLS connections served, by record layer
	sendErrors         *prometheus.CounterVec         // by error code name
	flowStrength       prometheus.Gauge
	egressUsage        prometheus.Gauge
	egressBytes        prometheus.CounterFunc
	backlogBytes       prometheus.Gauge
	order              [orderEvents]prometheus.Counter // room_seq order events (order.go)
}

func laneName(l int) string {
	switch clientpb.Lane(l) {
	case clientpb.Lane_LANE_CRITICAL:
		return "critical"
	case clientpb.Lane_LANE_BULK:
		return "bulk"
	}
	return "normal"
}

func newMetrics(reg prometheus.Registerer, n *Node) *metrics {
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_chatlink_deliveries_total", Help: "Messages written to client connections, by lane.",
	}, []string{"lane"})
	drops := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_chatlink_drops_total", Help: "Messages not delivered to a member, by lane and reason (budget, flow_control, slow_reader).",
	}, []string{"lane", "reason"})
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_chatlink_connections", Help: "Open client connections, logged in or not.",
		}),
		rooms: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_chatlink_rooms", Help: "Rooms with members on this node.",
		}),
		framesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_frames_in_total", Help: "Client frames received, by kind (bad: did not parse).",
		}, []string{"kind"}),
		pushFrames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_push_frames_total", Help: "Push frames written to client connections.",
		}),
		ringSends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_ring_sends_total", Help: "Sends of room frames to members made in io_uring batches (0 where the node writes plainly).",
		}),
		criticalOverBudget: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_critical_over_budget_total", Help: "Critical messages over a room's critical budget (delivered all the same).",
		}),
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_logins_total", Help: "Login attempts, by result.",
		}, []string{"result"}),
		loginSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "roomcast_chatlink_login_seconds", Help: "Time from a login frame to its answer (the ack, or the close that refuses it), the room service's admission included.",
			Buckets: prom.LatencyBuckets,
		}),
		recoveryReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_recovery_reads_total", Help: "Reads of a room's history made for logins' recoveries; the logins of a room that ask at the same time share one.",
		}),
		recoveryAskers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_recovery_read_askers_total", Help: "Logins' recoveries served by those reads (this over reads: how many share one).",
		}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_closes_total", Help: "Connections closed by the server, by close code.",
		}, []string{"code"}),
		tlsSessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_tls_connections_total", Help: "TLS connections past their handshake, by the record layer that serves them: roomcast (TLS 1.3 with AES-GCM, keys kept small) or crypto_tls (TLS 1.2, ChaCha20, a connection read by a goroutine).",
		}, []string{"record_layer"}),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_send_errors_total", Help: "Sends refused, by error code.",
		}, []string{"code"}),
		flowStrength: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_chatlink_flow_strength", Help: "Node flow-control strength, 0 (nothing held back) to 1 (critical only).",
		}),
		egressUsage: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_chatlink_egress_usage", Help: "Egress over the last second as a share of the configured capacity.",
		}),
		egressBytes: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "roomcast_chatlink_egress_bytes_total", Help: "Bytes of push frames handed to client connections.",
		}, func() float64 { return float64(n.egress.Load()) }),
		backlogBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "roomcast_chatlink_write_backlog_bytes", Help: "Bytes queued for client connections and not yet taken by their sockets.",
		}),
	}
	busLatency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "roomcast_chatlink_bus_request_seconds", Help: "Round trips of the node's requests over NATS, by op (join, send, history, queue, counters, viewers, moderate, attributes, recall): the bus and the service answering.",
		Buckets: prom.LatencyBuckets,
	}, []string{"op"})
	for op, name := range busOpNames {
		m.busSeconds[op] = busLatency.WithLabelValues(name)
	}
	m.frameLogin, m.frameSend = m.framesIn.WithLabelValues("login"), m.framesIn.WithLabelValues("send")
	m.frameHeartbeat, m.frameBad = m.framesIn.WithLabelValues("heartbeat"), m.framesIn.WithLabelValues("bad")
	m.frameHistory = m.framesIn.WithLabelValues("history_query")
	m.frameCounter = m.framesIn.WithLabelValues("counter_add")
	order := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_chatlink_order_total", Help: "Room_seq order (order.go), by event: held (batches held back behind a missing number), filled (missing messages taken from the history), skipped (missing numbers given up), late (messages delivered after a later number), duplicate (live copies of filled messages dropped).",
	}, []string{"event"})
	for e, name := range orderEventNames {
		m.order[e] = order.WithLabelValues(name)
	}
	for l := range m.deliveries {
		m.deliveries[l] = deliveries.WithLabelValues(laneName(l))
		for r := range m.drops[l] {
			m.drops[l][r] = drops.WithLabelValues(laneName(l), dropReasonNames[r])
		}
	}
	if reg != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": n.cfg.Node}, reg)
		reg.MustRegister(m.connections, m.rooms, m.framesIn, m.pushFrames, m.ringSends, deliveries, drops, m.criticalOverBudget,
			m.logins, m.loginSeconds, m.recoveryReads, m.recoveryAskers, busLatency, m.closes, m.tlsSessions, n.limits.limited, n.limits.handshakes, n.limits.reloads, m.sendErrors, m.flowStrength, m.egressUsage, m.egressBytes, m.backlogBytes, order,
			n.counters.windows, n.counters.adds)
		reg.MustRegister(n.pace.collectors()...)
	}
	return m
}

// laneCounters reads the node's deliveries and drops per lane from its metrics for the load
// report, so the fan-out counts each delivery once.
func (m *metrics) laneCounters() []*buspb.LaneCounters {
	out := make([]*buspb.LaneCounters, 0, 3)
	for _, l := range []clientpb.Lane{clientpb.Lane_LANE_CRITICAL, clientpb.Lane_LANE_NORMAL, clientpb.Lane_LANE_BULK} {
		drops := &m.drops[l]
		out = append(out, &buspb.LaneCounters{
			Lane:             l,
			Deliveries:       int64(prom.CounterValue(m.deliveries[l])),
			DropsBudget:      int64(prom.CounterValue(drops[dropBudget])),
			DropsFlowControl: int64(prom.CounterValue(drops[dropFlowControl])),
			DropsSlowReader:  int64(prom.CounterValue(drops[dropSlowReader])),
		})
	}
	return out
}

// countLogin counts a login's result and its time since start (zero: not timed); a refused
// one gets an audit record with the close code and reason the client is told.
func (n *Node) countLogin(c *conn, start time.Time, result string, code clientpb.CloseCode, reason string) {
	n.m.logins.WithLabelValues(result).Inc()
	if !start.IsZero() {
		n.m.loginSeconds.Observe(time.Since(start).Seconds())
	}
	if result == "ok" {
		return
	}
	n.audit.LogAttrs(context.Background(), slog.LevelWarn, "login refused",
		slog.String("result", result), slog.String("app", c.app), slog.String("room", c.room), slog.String("uid", c.uid),
		slog.String("close_code", code.String()), slog.String("reason", reason))
}

// request makes a request of op over NATS (bus.Request) and times its round trip.
func (n *Node) request(ctx context.Context, op int, subject string, req, rep proto.Message) error {
	start := time.Now()
	err := bus.Request(ctx, n.cfg.Bus, subject, req, rep)
	n.m.busSeconds[op].Observe(time.Since(start).Seconds())
	return err
}
