package chatlink

import (
	"context"
	"slices"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// Recall (docs/protocol.md, "Recall"): the room service stores a recall in the room's history,
// then broadcasts it on the room's subject. The node drops the recalled messages it holds and
// has not yet written (the room's pending messages), and writes the Recall, one frame encoded
// once, to every member: those that already have a message remove it, and every member drops it
// if it comes later (a recovery read before the recall, a CDN segment). Messages already in a
// connection's write queue go out; the client drops them.

// recall takes a Recall broadcast for the room.
func (r *localRoom) recall(rc *clientpb.Recall) {
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
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Recall{Recall: rc}})
	if err != nil {
		r.t.n.log.Error("encode recall", "err", err)
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	r.each(0, 1, func(c *conn) {
		if c.cdnAcked {
			c.write(b)
		}
	})
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
