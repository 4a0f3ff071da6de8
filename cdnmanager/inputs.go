package cdnmanager

import (
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
)

// What the manager hears on the bus: the pushers' reports (their leases), the ChatLinks' session
// reports (members per room) and load reports (flow-control strength). Every instance hears
// them, so a new leader knows them already.

type roomKey struct{ app, room string }

func (k roomKey) String() string { return k.app + "." + k.room }

// pusherState is what the last report of a pusher said.
type pusherState struct {
	seen     time.Time
	windowMs uint32
	leaving  bool
}

// nodeState is what a ChatLink's last reports said.
type nodeState struct {
	boot     string
	seq      uint64            // of the session report being received
	partial  map[roomKey]int64 // its chunks so far
	rooms    map[roomKey]int64 // members per room, as of the last complete report
	seen     time.Time         // of the last session report
	strength float64           // flow control, from the last load report
	loadSeen time.Time         // of the last load report
}

func (m *Manager) onPusherReport(msg *nats.Msg) {
	var r buspb.PusherReport
	if proto.Unmarshal(msg.Data, &r) != nil || r.Pusher == "" {
		return
	}
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, known := m.pushers[r.Pusher]
	m.pushers[r.Pusher] = pusherState{seen: now, windowMs: r.WindowMs, leaving: r.Leaving}
	if r.Leaving && !prev.leaving {
		m.kickLocked() // hand its rooms over now, not at the next tick
	}
	if !known && r.WindowMs != m.windowMs {
		m.log.Warn("pusher has another window: it gets no rooms", "pusher", r.Pusher, "window_ms", r.WindowMs, "want", m.windowMs)
	}
}

// onNodeReport takes a chunk of a ChatLink's session report; the chunk marked last completes it.
func (m *Manager) onNodeReport(msg *nats.Msg) {
	var r buspb.NodeReport
	if proto.Unmarshal(msg.Data, &r) != nil || r.Node == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.node(r.Node)
	if n.boot != r.Boot {
		n.boot, n.seq, n.partial = r.Boot, 0, nil
	}
	switch {
	case r.Seq < n.seq:
		return
	case r.Seq > n.seq || n.partial == nil:
		n.seq, n.partial = r.Seq, make(map[roomKey]int64, len(r.Rooms))
	}
	for _, rc := range r.Rooms {
		n.partial[roomKey{rc.App, rc.Room}] = rc.Members
	}
	n.seen = m.cfg.Now()
	if r.Last {
		n.rooms, n.partial = n.partial, nil
		n.seq++ // a straggling chunk of this report starts no new one
	}
}

func (m *Manager) onLoadReport(msg *nats.Msg) {
	var r buspb.LoadReport
	if proto.Unmarshal(msg.Data, &r) != nil || r.Node == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.node(r.Node)
	n.strength, n.loadSeen = r.FlowControlStrength, m.cfg.Now()
}

// node returns a ChatLink's state, creating it. Caller holds mu.
func (m *Manager) node(name string) *nodeState {
	n := m.nodes[name]
	if n == nil {
		n = &nodeState{}
		m.nodes[name] = n
	}
	return n
}

// roomLoad is what the rules look at: a room's members online and the strongest flow control
// of the ChatLinks holding them.
type roomLoad struct {
	online   int64
	strength float64
}

// loadsLocked sums the live ChatLinks' reports per room and forgets the ChatLinks silent for
// NodeLease. Caller holds mu.
func (m *Manager) loadsLocked(now time.Time) map[roomKey]roomLoad {
	loads := make(map[roomKey]roomLoad)
	for name, n := range m.nodes {
		if now.Sub(n.seen) > m.cfg.NodeLease && now.Sub(n.loadSeen) > m.cfg.NodeLease {
			delete(m.nodes, name)
			continue
		}
		strength := n.strength
		if now.Sub(n.loadSeen) > m.cfg.NodeLease {
			strength = 0
		}
		for k, members := range n.rooms {
			if members <= 0 {
				continue
			}
			l := loads[k]
			l.online += members
			l.strength = max(l.strength, strength)
			loads[k] = l
		}
	}
	return loads
}
