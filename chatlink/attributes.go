package chatlink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
)

// Room attributes (docs/protocol.md, "Room attributes"): the app server's writes reach the node
// as a RoomBatch with the room's whole set and its version (the store's revision); the node
// keeps the newest and writes it to the members that asked for the live state, one frame
// encoded once. A node's first login of a room gets the set in the room service's join answer;
// every login gets it after its LoginAck (afterLoginAck).

// setAttributes takes the room's attributes: a newer version than the room has is written to
// its members.
func (r *localRoom) setAttributes(a *clientpb.RoomAttributes) {
	for {
		cur := r.attrs.Load()
		if cur != nil && cur.Version >= a.Version {
			return
		}
		if r.attrs.CompareAndSwap(cur, a) {
			break
		}
	}
	r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_RoomAttributes{RoomAttributes: a}}, true, "room attributes")
}

// attributesPerConn bounds a connection's SetAttributes: a person's edits, not a script's. The
// room's own rate of members' changes (5 a second, room/attributes.go) is applied after the
// bus; this one keeps a looping client from loading the bus and the audit trail at its pace.
var attributesPerConn = ratelimit.Limit{Rate: 5, Burst: 10}

// limitAttributeConn names attributesPerConn in roomcast_chatlink_limited_total and in
// refusals.
const limitAttributeConn = "attribute_conn"

// setAttribute forwards a member's change of the room's attributes to the room service, which
// decides by the room's attributes_expr and attribute_keys (room/attributes.go), writes it and
// broadcasts the room's new set, and answers the client. Each change, taken or refused, gets an
// audit record, as the server API's calls do, written before the answer. It runs while the connection's reader waits
// (conn.handle), so a connection's changes are answered one at a time, in order.
func (c *conn) setAttribute(r *clientpb.SetAttribute) {
	n := c.node
	now := n.now()
	ok, retry := c.takeRate(func(s *connSends) *ratelimit.Bucket { return &s.attributeRate }, attributesPerConn, now)
	if !ok {
		// Counted and logged sampled, not audited one by one, as moderate requests over
		// their rate.
		n.limitHit(limitAttributeConn, c, now)
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_SetAttributeReply{SetAttributeReply: &clientpb.SetAttributeReply{
			Seq: r.Seq, Code: uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED), RetryAfterMs: ratelimit.Millis(retry),
			Message: fmt.Sprintf("over the %s rate: retry in %d ms", limitAttributeConn, ratelimit.Millis(retry)),
		}}})
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
	defer cancel()
	var rep buspb.Reply
	err := n.request(ctx, busAttributes, bus.SubjectRoomAttributes, &buspb.AttributeRequest{
		App: c.app, Room: c.room, Uid: c.uid, SessionId: c.session, Tags: c.tagList(),
		Key: r.Key, Value: r.Value, Remove: r.Remove,
	}, &rep)
	answer := &clientpb.SetAttributeReply{Seq: r.Seq, Code: rep.Code, Message: rep.Message, RetryAfterMs: rep.RetryAfterMs}
	if err != nil {
		answer.Code, answer.Message = uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), "room service did not answer"
	} else if answer.Code == 0 {
		answer.Version = rep.GetAttributes().GetVersion()
	}
	// The record is written before the answer, so a change the member was told of is in the
	// audit trail.
	level, result := slog.LevelInfo, "OK"
	if answer.Code != 0 {
		level, result = slog.LevelWarn, strings.TrimPrefix(clientpb.ErrorCode(answer.Code).String(), "ERROR_CODE_")
	}
	attrs := []slog.Attr{slog.String("method", "SetAttribute"),
		slog.String("app", c.app), slog.String("room", c.room), slog.String("uid", c.uid), slog.String("session", c.session),
		slog.String("key", r.Key), slog.Bool("remove", r.Remove), slog.String("result", result)}
	if answer.Message != "" {
		attrs = append(attrs, slog.String("error", answer.Message))
	}
	n.audit.LogAttrs(context.Background(), level, "member call", attrs...)
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_SetAttributeReply{SetAttributeReply: answer}})
}
