package chatlink

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a node's Prometheus instruments.
type metrics struct {
	connections prometheus.Gauge
	rooms       prometheus.Gauge
	framesIn    *prometheus.CounterVec // by frame kind
	deliveries  prometheus.Counter
	logins      *prometheus.CounterVec // by result
	closes      *prometheus.CounterVec // by close code name
	sendErrors  *prometheus.CounterVec // by error code name
}

func newMetrics(reg prometheus.Registerer, node string) *metrics {
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
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_deliveries_total", Help: "Messages handed to client connections.",
		}),
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_logins_total", Help: "Login attempts, by result.",
		}, []string{"result"}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_closes_total", Help: "Connections closed by the server, by close code.",
		}, []string{"code"}),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_send_errors_total", Help: "Sends refused, by error code.",
		}, []string{"code"}),
	}
	if reg != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": node}, reg)
		reg.MustRegister(m.connections, m.rooms, m.framesIn, m.deliveries, m.logins, m.closes, m.sendErrors)
	}
	return m
}
