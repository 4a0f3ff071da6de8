package chatlink

import (
	"context"
	"time"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// The load report tells the dispatcher, every ReportInterval on rc.load, how to reach the node
// and how loaded it is (connections, egress, CPU, the bus's round trip), so it can rank the
// node for new clients. It is not the node's lease with the services: that is the session
// report (stream.go).

// loadReport describes the node for the dispatcher; busRTT is the last measured round trip to
// NATS (zero: not measured).
func (n *Node) loadReport(busRTT time.Duration) *pb.LoadReport {
	return &pb.LoadReport{
		Node:                      n.cfg.Node,
		WsUrl:                     n.WSURL(),
		TcpAddr:                   n.TCPAddr(),
		TcpTls:                    n.TCPTLS(),
		Region:                    n.cfg.Region,
		Isp:                       n.cfg.ISP,
		Connections:               int64(n.conns.len()),
		MaxConnections:            int64(n.cfg.MaxConnections),
		Rooms:                     int64(n.rooms.count()),
		EgressBytesPerSec:         int64(n.flow.egressRate()),
		EgressCapacityBytesPerSec: int64(n.cfg.EgressCapacity),
		FlowControlStrength:       n.flow.strength(),
		Cpu:                       n.cpu.usage(),
		Draining:                  n.draining.Load(),
		TimeMs:                    n.now().UnixMilli(),

		BusRttUs:         busRTT.Microseconds(),
		ReportIntervalMs: n.cfg.ReportInterval.Milliseconds(),
	}
}

// measureBusRTT times a NATS ping, bounded by the report interval so a slow bus delays
// neither the next report nor shutdown. It returns zero when the ping fails.
func (n *Node) measureBusRTT() time.Duration {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ReportInterval)
	defer cancel()
	start := time.Now()
	if err := n.cfg.Bus.FlushWithContext(ctx); err != nil {
		return 0
	}
	return max(time.Since(start), time.Microsecond)
}

// loadReportLoop publishes the node's load report every ReportInterval until the node stops.
func (n *Node) loadReportLoop() {
	t := time.NewTicker(n.cfg.ReportInterval)
	defer t.Stop()
	for {
		var backlog int64
		n.conns.each(func(c *conn) { backlog += c.t.pending() })
		n.m.backlogBytes.Set(float64(backlog))
		if err := bus.Publish(n.cfg.Bus, bus.SubjectLoad, n.loadReport(n.measureBusRTT())); err != nil {
			n.log.Warn("load report not published", "err", err)
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}
