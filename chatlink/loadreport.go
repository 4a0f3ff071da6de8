package chatlink

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
)

// The load report tells the dispatcher, every ReportInterval on rc.load, how to reach the node
// and how loaded it is (connections, egress, CPU, the bus's round trip), so it can rank the
// node for new clients; it also carries the node's deliveries and drops per lane, read from its
// metrics, for the ops console. It is not the node's lease with the services: that is the session
// report (stream.go).

// maxHeldRooms bounds the rooms a load report lists (rooms_held), biggest first: 1,000 rooms
// are about 40 KB, where a node's every room (100k on a busy node) would be megabytes a second
// for the dispatcher to read from every node. The rooms left out are the smallest: their
// members are steered by what the dispatcher sent since the last report (docs/dispatch.md).
const maxHeldRooms = 1000

// loadReport describes the node for the dispatcher; busRTT is the last measured round trip to
// NATS (zero: not measured).
func (n *Node) loadReport(busRTT time.Duration) *buspb.LoadReport {
	held, partial := n.rooms.biggest(maxHeldRooms)
	return &buspb.LoadReport{
		Node:                      n.cfg.Node,
		WsUrl:                     n.WSURL(),
		TcpAddr:                   n.TCPAddr(),
		TcpTls:                    n.TCPTLS(),
		Region:                    n.cfg.Region,
		Isp:                       n.cfg.ISP,
		Pool:                      n.cfg.Pool,
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
		RoomsHeld:        held,
		RoomsHeldPartial: partial,
		Lanes:            n.m.laneCounters(),
	}
}

// roomSize is a room's key (app/room) and its local members.
type roomSize struct {
	key     string
	members int
}

// biggest returns the limit rooms with the most local members, most first, and whether rooms
// were left out. It keeps the biggest in a heap as it walks the rooms, so a node with 100k rooms
// compares member counts, not names, and makes a RoomCount only for the rooms it returns.
func (t *roomTable) biggest(limit int) ([]*buspb.RoomCount, bool) {
	top := make(roomHeap, 0, limit)
	partial := false
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for key, r := range sh.rooms {
			r.mu.RLock()
			size := r.size()
			r.mu.RUnlock()
			switch {
			case size == 0:
			case len(top) < limit:
				top.push(roomSize{key, size})
			default:
				partial = true
				if size > top[0].members {
					top.replaceMin(roomSize{key, size})
				}
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(top, func(a, b roomSize) int {
		return cmp.Or(cmp.Compare(b.members, a.members), strings.Compare(a.key, b.key))
	})
	out := make([]*buspb.RoomCount, len(top))
	for i, r := range top {
		app, room, _ := strings.Cut(r.key, "/")
		out[i] = &buspb.RoomCount{App: app, Room: room, Members: int64(r.members)}
	}
	return out, partial
}

// roomHeap is a min-heap of rooms by members: top[0] is the smallest kept.
type roomHeap []roomSize

func (h *roomHeap) push(r roomSize) {
	*h = append(*h, r)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p].members <= s[i].members {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h roomHeap) replaceMin(r roomSize) {
	h[0] = r
	for i := 0; ; {
		m, l, rt := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].members < h[m].members {
			m = l
		}
		if rt < len(h) && h[rt].members < h[m].members {
			m = rt
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
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
