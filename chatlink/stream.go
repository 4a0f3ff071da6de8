package chatlink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
)

// The session stream is everything a node tells the services about its sessions, on the
// rc.sessions.* subjects: batches of login/logout events (eventbatcher.go), snapshots
// of every live session (on request, when a service restarted or its view drifted) and a report
// every ReportInterval. The report is the node's lease: a service that hears no report from a
// node for its lease time drops the node's sessions and members, so a node that dies without a
// goodbye leaves nothing behind and no service needs a timer per session. The report also carries
// the node's member count per room, which is where the room service's counts come from.
//
// The three share one sequence per node and are published under mu, after flushing the pending
// events, so a reader that applies them in order always holds a view that some moment of the
// node's state matched.
type sessionStream struct {
	// mu guards the fields below and orders publishing on the stream. Lock order:
	// sessionStream.mu -> eventBatcher.mu, roomShard.mu (counts) and conn.mu (states).
	mu       sync.Mutex
	boot     string // random per start: a restarted node with the same name is a new node
	seq      uint64
	lastSnap time.Time
}

// Chunk sizes keep every stream message well under NATS's 1 MiB payload limit.
const (
	snapshotChunk = 2000
	reportChunk   = 5000
	// snapshotMinGap stops a burst of resync requests (one per service instance) from making
	// the node publish its snapshot more than once.
	snapshotMinGap = 250 * time.Millisecond
)

func newBoot() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// publishEventsLocked publishes a batch of session events with ctx's trace context. Caller
// holds n.stream.mu.
func (n *Node) publishEventsLocked(ctx context.Context, evs []*buspb.SessionEvent) error {
	n.stream.seq++
	return bus.PublishTraced(ctx, n.cfg.Bus, bus.SubjectPresenceEvents, &buspb.SessionEvents{
		Events: evs, Node: n.cfg.Node, Boot: n.stream.boot, Seq: n.stream.seq,
	})
}

// publishSnapshot publishes every live session of the node, unless it did so a moment ago.
func (n *Node) publishSnapshot() {
	n.stream.mu.Lock()
	defer n.stream.mu.Unlock()
	if time.Since(n.stream.lastSnap) < snapshotMinGap {
		return
	}
	n.stream.lastSnap = time.Now()
	// The sessions the stream has told, not the live connections: a login whose state changed
	// and whose event is not queued yet is in neither, and its event comes after.
	streamed := n.presence.flushStreamed()
	sessions := make([]*buspb.SessionEvent, len(streamed))
	for i, c := range streamed {
		sessions[i] = c.sessionEvent(buspb.SessionEvent_KIND_LOGIN, c.loginMS)
	}
	n.stream.seq++
	for i := 0; ; i += snapshotChunk {
		end := min(i+snapshotChunk, len(sessions))
		snap := &buspb.NodeSnapshot{Node: n.cfg.Node, Boot: n.stream.boot, Seq: n.stream.seq, Sessions: sessions[i:end], Last: end == len(sessions)}
		if err := bus.Publish(n.cfg.Bus, bus.SubjectSessionsSnapshot, snap); err != nil {
			n.log.Warn("session snapshot not published", "err", err)
			return
		}
		if snap.Last {
			return
		}
	}
}

// publishSessionReport renews the node's lease and reports its members per room.
func (n *Node) publishSessionReport() {
	n.stream.mu.Lock()
	defer n.stream.mu.Unlock()
	n.presence.flushLocked()
	live := n.presence.sessions() // as the stream told them: a reader counts the same
	rooms := n.rooms.counts()
	n.stream.seq++
	now := n.now().UnixMilli()
	for i := 0; ; i += reportChunk {
		end := min(i+reportChunk, len(rooms))
		rep := &buspb.NodeReport{Node: n.cfg.Node, Boot: n.stream.boot, Seq: n.stream.seq, TimeMs: now, Sessions: live, Rooms: rooms[i:end], Last: end == len(rooms)}
		if err := bus.Publish(n.cfg.Bus, bus.SubjectSessionsReport, rep); err != nil {
			n.log.Warn("node report not published", "err", err)
			return
		}
		if rep.Last {
			return
		}
	}
}

// sessionReportLoop publishes the node's session report, its lease with the services, every
// ReportInterval until the node stops, and lets go of expired tombstones (control.go).
func (n *Node) sessionReportLoop() {
	t := time.NewTicker(n.cfg.ReportInterval)
	defer t.Stop()
	for {
		n.publishSessionReport()
		n.control.expireTombstones(n.now())
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}
