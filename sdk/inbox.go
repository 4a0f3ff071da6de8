package sdk

import (
	"roomcast/proto/clientpb"
)

// At-least-once messages (Message.at_least_once): the server stores them for the user until a
// session acknowledges them, and sends the stored ones after each login (Login.inbox). The
// Client acknowledges each once OnMessage has returned for it, and drops the copies that come
// again, by id, acknowledging those too: a copy comes again because its acknowledgement did
// not reach the server (the connection dropped first), and it would come at every login until
// one does.

// inboxWindow is how many at-least-once message ids a Client remembers: a user has at most 100
// stored (the deployment's default), so this covers many logins' worth.
const inboxWindow = 1000

// maxAckIDs is the most ids one Ack frame may carry.
const maxAckIDs = 100

// inboxSeen remembers the at-least-once messages a Client has taken, in a ring of inboxWindow
// ids: whether each was handed to the app yet. Its owner (the delivery) guards it.
type inboxSeen struct {
	handed map[string]bool // by id: false while queued for OnMessage, true once handed on
	order  []string        // the ids in handed, as a ring: order[next] is forgotten first
	next   int
}

// takeLocked handles the at-least-once messages of msgs and returns the others. A new one is
// queued for OnMessage at once: it is not part of the room's order, so it neither waits for a
// history answer nor moves where recovery starts. A copy of one handed on already is queued to
// be acknowledged again; a copy of one still queued is dropped, its original will be
// acknowledged. Caller holds d.mu.
func (d *delivery) takeInboxLocked(msgs []*clientpb.Message) []*clientpb.Message {
	rest := msgs[:0:0]
	for _, m := range msgs {
		if !m.GetAtLeastOnce() {
			rest = append(rest, m)
			continue
		}
		handed, seen := d.inbox.handed[m.GetId()]
		switch {
		case d.window < 0: // de-duplication off
			d.enqueueLocked(item{msg: m})
		case !seen:
			d.inbox.remember(m.GetId())
			d.enqueueLocked(item{msg: m})
		case handed:
			d.duplicates++
			d.enqueueLocked(item{ack: m.GetId()})
		default:
			d.duplicates++
		}
	}
	return rest
}

func (s *inboxSeen) remember(id string) {
	if s.handed == nil {
		s.handed = make(map[string]bool)
	}
	if len(s.order) < inboxWindow {
		s.order = append(s.order, id)
	} else {
		delete(s.handed, s.order[s.next])
		s.order[s.next] = id
		s.next = (s.next + 1) % inboxWindow
	}
	s.handed[id] = false
}

// handedOn marks the at-least-once message id as handed to the app: from now on its copies
// are acknowledged again.
func (d *delivery) handedOn(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.inbox.handed[id]; ok {
		d.inbox.handed[id] = true
	}
}

// ack tells the server that the app has the at-least-once messages ids, on the live
// connection. Without one (reconnecting), or if the write fails, the server keeps them and
// sends them again after the next login, where they are dropped as copies and acknowledged.
func (c *Client) ack(ids []string) {
	c.mu.Lock()
	cur := c.cur
	c.mu.Unlock()
	if cur == nil {
		c.log.Debug("roomcast: acknowledgements wait for the next login", "ids", len(ids))
		return
	}
	for len(ids) > 0 {
		n := min(len(ids), maxAckIDs)
		if err := cur.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Ack{Ack: &clientpb.Ack{Ids: ids[:n]}}}); err != nil {
			c.log.Debug("roomcast: acknowledgements wait for the next login", "ids", len(ids), "err", err)
			return
		}
		ids = ids[n:]
	}
}
