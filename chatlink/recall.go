package chatlink

import (
	"context"
	"slices"
	"sync"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// Recall (docs/protocol.md, "Recall"): the room service stores a recall in the room's history,
// then broadcasts it on the room's subject. The node drops the recalled messages it holds and
// has not yet written (the room's pending messages), and writes the Recall, one frame encoded
// once, to every member: those that already have a message remove it, and every member drops it
// if it comes later (a recovery read before the recall, a CDN segment). Messages already in a
// connection's write queue go out; the client drops them.

// recentRecalls are a room's recalls heard in the last historystore.RecentRecallAge, oldest
// first: a node repeats them to the room's new logins when the room is in CDN mode, since a new
// client starts polling at the current segment, which may hold a message recalled a moment ago,
// and that client never had the recall's broadcast. The node's first login of the room brings
// those stored before the node held the room (the room service's join answer).
type recentRecalls struct {
	mu   sync.Mutex // guards list; taken alone
	list []*clientpb.RecalledMessage
	at   []time.Time // when each was heard
}

// add keeps rc's recalls, heard at now, and forgets those older than RecentRecallAge.
func (rr *recentRecalls) add(rc *clientpb.Recall, now time.Time) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.expireLocked(now)
	for _, m := range rc.Messages {
		rr.list = append(rr.list, m)
		rr.at = append(rr.at, now)
	}
}

// stored takes the recalls the room service read for the node's first login of the room, each
// heard when it was recalled, before any the node hears live.
func (rr *recentRecalls) stored(rc *clientpb.Recall, now time.Time) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	var list []*clientpb.RecalledMessage
	var at []time.Time
	for _, m := range rc.GetMessages() {
		if t := time.UnixMilli(m.GetRecalledMs()); now.Sub(t) <= historystore.RecentRecallAge && !slices.ContainsFunc(rr.list, func(h *clientpb.RecalledMessage) bool { return h.GetId() == m.GetId() }) {
			list, at = append(list, m), append(at, t)
		}
	}
	rr.list, rr.at = append(list, rr.list...), append(at, rr.at...)
}

// recent returns the recalls heard in the last RecentRecallAge, or nil.
func (rr *recentRecalls) recent(now time.Time) []*clientpb.RecalledMessage {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.expireLocked(now)
	return slices.Clone(rr.list)
}

// expireLocked forgets the recalls older than RecentRecallAge. Caller holds rr.mu.
func (rr *recentRecalls) expireLocked(now time.Time) {
	i := 0
	for i < len(rr.at) && now.Sub(rr.at[i]) > historystore.RecentRecallAge {
		i++
	}
	rr.list, rr.at = rr.list[i:], rr.at[i:]
}

// recall takes a Recall broadcast for the room.
func (r *localRoom) recall(rc *clientpb.Recall) {
	r.recalls.add(rc, r.t.n.now())
	gone := make(map[string]bool, len(rc.Messages))
	for _, m := range rc.Messages {
		gone[m.GetId()] = true
	}
	f := &r.fanout
	f.mu.Lock()
	if !f.stopped {
		f.pending = slices.DeleteFunc(f.pending, func(q queued) bool { return gone[q.m.GetId()] })
	}
	f.mu.Unlock()
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_Recall{Recall: rc}}, false, "recall")
}

// recallRequest forwards a member's recall of a message it sent to the room service, naming
// the member, and answers the client. Like a queue request it runs while the connection's
// reader waits, so a connection's recalls are answered one at a time, in order.
func (c *conn) recallRequest(q *clientpb.RecallRequest) {
	n := c.node
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
	defer cancel()
	var rep buspb.Reply
	err := n.request(ctx, busRecall, bus.SubjectRoomRecall, &buspb.RoomRecallRequest{
		App: c.app, Room: c.room, MessageId: q.MessageId, Uid: c.uid, SessionId: c.session,
	}, &rep)
	answer := &clientpb.RecallReply{Seq: q.Seq, Code: rep.Code, Message: rep.Message}
	if err != nil {
		answer.Code, answer.Message = uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), "room service did not answer"
	} else if rep.Code == 0 {
		answer.RecalledMs, answer.AlreadyRecalled = rep.GetRecalled().GetRecalledMs(), rep.AlreadyRecalled
	}
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_RecallReply{RecallReply: answer}})
}
