package chatlink

import (
	"context"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// queueRequest forwards a member's room queue request to the room queue service, naming the
// member (uid, session, tags) so that the service can apply the room's queue_expr and
// queue_admin_expr, and answers the client. It runs while the connection's reader waits
// (conn.handle), so a connection's queue requests are answered one at a time, in order.
func (c *conn) queueRequest(r *clientpb.RoomQueueRequest) {
	n := c.node
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
	defer cancel()
	var rep buspb.Reply
	err := n.request(ctx, busQueue, bus.SubjectQueue, &buspb.QueueBusRequest{
		App: c.app, Op: r.Op,
		Request: &roompb.QueueRequest{
			Room: c.room, Key: r.Key, Value: r.Value, Uid: c.uid, SessionId: c.session,
			IfAbsent: r.IfAbsent, DropOnLeave: r.DropOnLeave,
		},
		MemberSession: c.session, MemberTags: c.tagList(),
	}, &rep)
	answer := &clientpb.RoomQueueReply{Seq: r.Seq, Code: rep.Code, Message: rep.Message}
	if err != nil {
		answer.Code, answer.Message = uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), "room queue service did not answer"
	} else if q := rep.Queue; q != nil {
		answer.Entries, answer.Version = q.Entries, q.Version
	}
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_QueueReply{QueueReply: answer}})
}
