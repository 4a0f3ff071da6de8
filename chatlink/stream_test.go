package chatlink_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
)

// streamReader reads one node's session stream as presence does: events, snapshots and
// reports in order, and at every report compares its own count with the report's.
type streamReader struct {
	node string

	mu         sync.Mutex
	seq        uint64
	sessions   map[string]bool
	snap       map[string]bool
	reports    int
	mismatches []string
}

func (r *streamReader) read(m *nats.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.Subject {
	case bus.SubjectPresenceEvents:
		var evs buspb.SessionEvents
		if proto.Unmarshal(m.Data, &evs) != nil || evs.Node != r.node || evs.Seq <= r.seq {
			return
		}
		for _, ev := range evs.Events {
			switch ev.Kind {
			case buspb.SessionEvent_KIND_LOGIN:
				r.sessions[ev.SessionId] = true
			case buspb.SessionEvent_KIND_LOGOUT:
				delete(r.sessions, ev.SessionId)
			}
		}
		r.seq = evs.Seq
	case bus.SubjectSessionsSnapshot:
		var snap buspb.NodeSnapshot
		if proto.Unmarshal(m.Data, &snap) != nil || snap.Node != r.node || snap.Seq <= r.seq {
			return
		}
		if r.snap == nil {
			r.snap = make(map[string]bool)
		}
		for _, ev := range snap.Sessions {
			r.snap[ev.SessionId] = true
		}
		if snap.Last {
			r.sessions, r.snap, r.seq = r.snap, nil, snap.Seq
		}
	case bus.SubjectSessionsReport:
		var rep buspb.NodeReport
		if proto.Unmarshal(m.Data, &rep) != nil || rep.Node != r.node || !rep.Last || rep.Seq <= r.seq {
			return
		}
		r.reports++
		if int64(len(r.sessions)) != rep.Sessions {
			r.mismatches = append(r.mismatches, fmt.Sprintf("report %d: %d sessions, the stream told %d", rep.Seq, rep.Sessions, len(r.sessions)))
		}
		r.seq = rep.Seq
	}
}

// TestReportCountsWhatTheStreamTold: while a crowd logs in (some closing while their logins are
// on their way) and half of it leaves, every session report of the node counts exactly the sessions its stream has told (logins published, their
// logouts not): a reader of the stream, presence, never sees a count differ from its own, and
// never asks a node in a login storm for a snapshot of every session. A count taken from the
// connections' states differed: a login is live before its event is queued. At the end the
// stream tells exactly the sessions still open.
func TestReportCountsWhatTheStreamTold(t *testing.T) {
	t.Parallel()
	const crowd, quitters = 300, 50
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		// A report every 2 ms, each a chance to catch a login between its state and its event;
		// the services' leases long, so that only a count can make presence ask for a snapshot.
		cfg.LeaseInterval = 2 * time.Millisecond
		cfg.Room.LeaseTTL, cfg.Presence.LeaseTTL = time.Minute, time.Minute
	})
	node := c.Nodes[0]
	nc, err := bus.Connect(c.NATSURL(), "stream reader", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := &streamReader{node: node.Name(), sessions: make(map[string]bool)}
	// One subscription for the three subjects, so that one handler reads them in the order the
	// node published them.
	sub, err := nc.Subscribe(bus.SubjectSessions, r.read)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var resyncs atomic.Int64 // presence's requests for a snapshot
	ctl, err := nc.Subscribe(bus.NodeSubject(node.Name()), func(m *nats.Msg) {
		var op buspb.NodeControl
		if proto.Unmarshal(m.Data, &op) == nil && op.Op == buspb.NodeControl_OP_RESYNC {
			resyncs.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	clients := make([]*testkit.Client, crowd)
	for i := range clients {
		clients[i] = testkit.DialTCP(t, node.TCPAddr())
	}
	before := func() int { r.mu.Lock(); defer r.mu.Unlock(); return r.reports }()
	for i, cl := range clients {
		cl.Send(loginFrame(testcluster.Token(t, fmt.Sprintf("u%d", i), "storm")))
		if i >= crowd-quitters {
			cl.Close() // gone while its login is on its way: in the stream, then out, or never
		}
	}
	stay := clients[:crowd-quitters]
	for i, cl := range stay {
		if f := cl.Next(); f.GetLoginAck() == nil {
			t.Fatalf("client %d: %v, want a LoginAck", i, f)
		}
	}
	for _, cl := range stay[:len(stay)/2] {
		cl.Close()
	}
	want := len(stay) - len(stay)/2
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.sessions) != want {
			return fmt.Errorf("the stream tells %d sessions, want %d", len(r.sessions), want)
		}
		return nil
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if during := r.reports - before; during < 20 {
		t.Errorf("%d reports during the logins and logouts: too few to show anything", during)
	}
	for _, m := range r.mismatches {
		t.Error(m)
	}
	if n := resyncs.Load(); n > 0 {
		t.Errorf("presence asked the node for %d snapshots", n)
	}
}
