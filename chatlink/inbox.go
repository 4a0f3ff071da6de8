package chatlink

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
	"roomcast/store/inbox"
)

// The inbox: a user's at-least-once messages (Message.at_least_once), stored by the server API
// until a session of the user acknowledges them. A login that asks (Login.inbox) gets the
// stored ones after its LoginAck; an Ack frame removes those its app has. The live ones reach
// the sessions through the server API's OP_DELIVER like any message to users (control.go).

// inboxTimeout bounds reading a user's stored messages at login, and applying one Ack.
const inboxTimeout = 2 * time.Second

// inboxRecheck is when a login reads the user's stored messages a second time. The server API
// hands a new message to the sessions presence knows; a session is known only once the node
// has published its login (every 100 ms) and presence has taken it, so a message stored after
// the first read but before then would otherwise wait for the next login.
const inboxRecheck = time.Second

// inboxReadWait is how long a login's first read waits for other logins to share it. The
// reads are made in batches: one request asks which of the batch's users have anything
// stored (inbox.Store.Holding), and only those users' messages are read; most have none.
const inboxReadWait = 20 * time.Millisecond

// maxAckQueue bounds the ids a connection's Acks may have waiting for the store; past it an
// Ack is refused with ACK_FAILED (its messages stay stored and come again at the next login).
const maxAckQueue = 4 * inbox.MaxAckIDs

// inboxState is a node's access to the stored messages, and its counts of them.
type inboxState struct {
	store     *inbox.Store
	delivered prometheus.Counter
	acked     prometheus.Counter
	failures  *prometheus.CounterVec // by operation: read (at login), ack

	wake chan struct{} // a login waits for its first read (capacity 1)

	mu    sync.Mutex // guards the fields below
	first []*conn    // logins waiting for their first read
	due   []recheck  // logins waiting for their second read, oldest first
}

// recheck is a login's second read of its stored messages, due at a time.
type recheck struct {
	c  *conn
	at time.Time
}

func newInboxState(n *Node) *inboxState {
	s := &inboxState{
		wake: make(chan struct{}, 1),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_inbox_delivered_total", Help: "Stored at-least-once messages written to sessions at login.",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_chatlink_inbox_acked_total", Help: "Stored at-least-once messages removed by clients' Ack frames.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roomcast_chatlink_inbox_failures_total", Help: "Reads of a user's stored messages at login (read) and Ack frames (ack) that failed; the messages stay stored.",
		}, []string{"op"}),
	}
	if reg := n.cfg.Registry; reg != nil {
		prometheus.WrapRegistererWith(prometheus.Labels{"node": n.cfg.Node}, reg).MustRegister(s.delivered, s.acked, s.failures)
	}
	return s
}

// inboxAcks is a connection's Acks waiting for the store. One goroutine at a time applies them.
type inboxAcks struct {
	mu      sync.Mutex        // guards the fields below
	known   map[string]uint64 // the stream sequences of the messages delivered at login, by id
	pending []string          // ids acknowledged and not yet removed
	running bool              // ackLoop is running
}

// ackQueue returns c's Ack queue, made at its first use: most connections never have one.
func (c *conn) ackQueue() *inboxAcks {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.acks == nil {
		c.acks = new(inboxAcks)
	}
	return c.acks
}

// deliverInbox has the user's stored messages written to c after its LoginAck, in Push
// frames, read with other logins' (inboxReadWait), and read again a second later
// (inboxRecheck).
func (n *Node) deliverInbox(c *conn) {
	n.inbox.mu.Lock()
	n.inbox.first = append(n.inbox.first, c)
	n.inbox.mu.Unlock()
	select {
	case n.inbox.wake <- struct{}{}:
	default: // the loop is woken already
	}
}

// readInbox writes the user's stored messages that c was not given yet. If they cannot be read
// the session goes on without them: they stay stored, for the next login.
func (n *Node) readInbox(c *conn) {
	ctx, cancel := context.WithTimeout(n.ctx, inboxTimeout)
	defer cancel()
	stored, err := n.inbox.store.List(ctx, c.app, c.uid)
	if err != nil {
		n.inbox.failures.WithLabelValues("read").Inc()
		n.log.Warn("stored messages not read at login: they come at the next one", "session", c.session, "err", err)
	}
	if len(stored) == 0 {
		return
	}
	var msgs []*clientpb.Message
	q := c.ackQueue()
	q.mu.Lock()
	if q.known == nil {
		q.known = make(map[string]uint64, len(stored))
	}
	for _, s := range stored {
		if _, sent := q.known[s.Message.Id]; !sent {
			msgs = append(msgs, s.Message)
			q.known[s.Message.Id] = s.Seq
		}
	}
	q.mu.Unlock()
	for _, b := range pushFrames(msgs, pushMeta{}) {
		c.write(b)
	}
	n.inbox.delivered.Add(float64(len(msgs)))
}

// inboxLoop runs the logins' reads of their stored messages: the first ones inboxReadWait
// after a login asks, the second ones when they are due, each batch in one request
// (readInboxes), until the node stops.
func (n *Node) inboxLoop() {
	t := time.NewTicker(inboxRecheck / 10)
	defer t.Stop()
	wait := time.NewTimer(inboxReadWait)
	wait.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.inbox.wake:
			wait.Reset(inboxReadWait)
			select {
			case <-n.ctx.Done():
				return
			case <-wait.C:
			}
		case <-t.C:
		}
		n.readInboxes(n.inbox.take(n.now()))
	}
}

// take returns the logins whose read is due at now: those waiting for their first, whose
// second is then scheduled, and those whose second is due.
func (s *inboxState) take(now time.Time) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for i < len(s.due) && !s.due[i].at.After(now) {
		i++
	}
	out := make([]*conn, 0, i+len(s.first))
	for _, r := range s.due[:i] {
		out = append(out, r.c)
	}
	s.due = s.due[i:]
	for _, c := range s.first {
		s.due = append(s.due, recheck{c: c, at: now.Add(inboxRecheck)})
	}
	out = append(out, s.first...)
	s.first = nil
	return out
}

// readInboxes reads the stored messages of the users of cs that have any, each on a goroutine
// of its own (readInbox), after asking which have any in one request per inbox.MaxHolding
// users. If that cannot be answered, every user's are read.
func (n *Node) readInboxes(cs []*conn) {
	for len(cs) > 0 {
		batch := cs[:min(len(cs), inbox.MaxHolding)]
		cs = cs[len(batch):]
		live := batch[:0]
		users := make([]inbox.User, 0, len(batch))
		for _, c := range batch {
			if c.getState() == stateLive {
				live = append(live, c)
				users = append(users, inbox.User{App: c.app, UID: c.uid})
			}
		}
		if len(live) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, inboxTimeout)
		has, err := n.inbox.store.Holding(ctx, users)
		cancel()
		if err != nil {
			n.log.Warn("not known which users have stored messages: reading each", "users", len(users), "err", err)
		}
		for i, c := range live {
			if err != nil || has[i] {
				n.goAsync(func() { n.readInbox(c) })
			}
		}
	}
}

// ack queues the ids of an Ack frame for removal from the user's store. A malformed Ack closes
// the connection, like any malformed frame.
func (c *conn) ack(a *clientpb.Ack) {
	if len(a.Ids) == 0 || len(a.Ids) > inbox.MaxAckIDs {
		c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "an Ack carries 1 to 100 message ids")
		return
	}
	for _, id := range a.Ids {
		if _, ok := ids.MessageTime(id); !ok {
			c.close(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME, "an Ack carries message ids")
			return
		}
	}
	q := c.ackQueue()
	q.mu.Lock()
	if len(q.pending)+len(a.Ids) > maxAckQueue {
		q.mu.Unlock()
		c.node.inbox.failures.WithLabelValues("ack").Inc()
		c.ackFailed("too many acknowledgements waiting: the messages come again at the next login")
		return
	}
	q.pending = append(q.pending, a.Ids...)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		c.node.goAsync(c.ackLoop)
	}
}

// ackLoop removes the acknowledged messages from the store, up to inbox.MaxAckIDs at a time,
// until none wait. A failure is told to the client (ACK_FAILED): the messages stay stored.
func (c *conn) ackLoop() {
	n, q := c.node, c.ackQueue()
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.pending, q.running = nil, false
			q.mu.Unlock()
			return
		}
		batch := q.pending[:min(len(q.pending), inbox.MaxAckIDs)]
		q.pending = q.pending[len(batch):]
		known := make(map[string]uint64, len(batch))
		for _, id := range batch {
			if seq, ok := q.known[id]; ok {
				known[id] = seq // kept in q.known: the second read must not send it again
			}
		}
		q.mu.Unlock()

		ctx, cancel := context.WithTimeout(n.ctx, inboxTimeout)
		removed, err := n.inbox.store.Ack(ctx, c.app, c.uid, batch, known)
		cancel()
		n.inbox.acked.Add(float64(removed))
		if err != nil {
			n.inbox.failures.WithLabelValues("ack").Inc()
			n.log.Warn("ack not applied: the messages stay stored", "session", c.session, "ids", len(batch), "err", err)
			c.ackFailed("the store did not answer: the messages come again at the next login")
		}
	}
}

// ackFailed tells the client that an Ack was not applied.
func (c *conn) ackFailed(why string) {
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{Code: uint32(clientpb.ErrorCode_ERROR_CODE_ACK_FAILED), Message: why}}})
}
