package chatlink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ratelimit"
	"roomcast/internal/tracing"
	"roomcast/proto/clientpb"
)

// moderatePerConn bounds a connection's moderate requests: a person's clicks, not a script's.
var moderatePerConn = ratelimit.Limit{Rate: 5, Burst: 10}

// limitModerateConn names moderatePerConn in roomcast_chatlink_limited_total and in refusals.
const limitModerateConn = "moderate_conn"

// moderate passes a member's ModerateRequest to the room service, naming the member as this node
// knows it (uid, session, current tags): the service judges whether the member moderates the
// room and whether the target is in its scope, and applies the action (room/moderate.go). The
// node answers the client and writes the audit record, to the audit trail the server API's
// moderation calls go to, naming the moderator. It runs while the connection's reader waits
// (conn.handle), so a connection's moderate requests are answered one at a time, in order.
func (c *conn) moderate(r *clientpb.ModerateRequest) {
	n := c.node
	now := n.now()
	ok, retry := c.takeRate(func(s *connSends) *ratelimit.Bucket { return &s.moderateRate }, moderatePerConn, now)
	if !ok {
		// Counted and logged sampled, not audited one by one: a client looping on the frame
		// would otherwise write the audit trail at its own pace.
		n.limitHit(limitModerateConn, c, now)
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_ModerateReply{ModerateReply: &clientpb.ModerateReply{
			Seq: r.Seq, Code: uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED),
			Message: fmt.Sprintf("over the %s rate: retry in %d ms", limitModerateConn, ratelimit.Millis(retry)),
		}}})
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.RequestTimeout)
	defer cancel()
	ctx, span := tracing.Start(ctx, "chatlink moderate", trace.SpanKindServer)
	defer span.End()
	// The audit record names the trace: the span's, or with tracing off a new one the request
	// carries to the room service.
	tp := bus.ChildTraceparent("")
	if sc := span.SpanContext(); sc.IsValid() {
		tp = "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
	}
	ctx = bus.WithTraceparent(ctx, tp)
	var rep buspb.Reply
	err := n.request(ctx, busModerate, bus.SubjectRoomModerate, &buspb.ModerateBusRequest{
		App: c.app, Room: c.room, Uid: c.uid, SessionId: c.session, Tags: c.tagList(), Request: r,
	}, &rep)
	answer := &clientpb.ModerateReply{Seq: r.Seq, Code: rep.Code, Message: rep.Message, Affected: rep.Affected}
	if err != nil {
		answer.Code, answer.Message = uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), "room service did not answer: the action may or may not have been applied"
	}
	n.auditModerate(ctx, c, r, answer) // before the answer: an action the moderator was told of is in the trail
	c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_ModerateReply{ModerateReply: answer}})
}

// auditModerate writes the audit record of a moderator's request: like the server API's records
// of its calls ("api call"), at info level when it was applied and warn when it was refused, with
// the moderator (uid, session) where the API names its key, and the message a recall names.
func (n *Node) auditModerate(ctx context.Context, c *conn, r *clientpb.ModerateRequest, answer *clientpb.ModerateReply) {
	level := slog.LevelInfo
	result := "OK"
	if answer.Code != 0 {
		level, result = slog.LevelWarn, strings.TrimPrefix(clientpb.ErrorCode(answer.Code).String(), "ERROR_CODE_")
	}
	if !n.audit.Enabled(ctx, level) {
		return
	}
	traceID, _ := bus.TraceID(bus.TraceparentFrom(ctx))
	attrs := []slog.Attr{
		slog.String("transport", "client"), slog.String("op", strings.ToLower(strings.TrimPrefix(r.Op.String(), "MODERATE_OP_"))),
		slog.String("app", c.app), slog.String("room", c.room), slog.String("uid", r.Uid),
		slog.String("moderator", c.uid), slog.String("moderator_session", c.session),
		slog.String("result", result), slog.Int64("affected", answer.Affected), slog.String("trace_id", traceID),
	}
	if r.MessageId != "" {
		attrs = append(attrs, slog.String("message_id", r.MessageId))
	}
	if r.DurationMs != 0 {
		attrs = append(attrs, slog.Duration("duration", time.Duration(r.DurationMs)*time.Millisecond))
	}
	if answer.Code != 0 {
		attrs = append(attrs, slog.String("error", answer.Message))
	}
	n.audit.LogAttrs(context.Background(), level, "moderator action", attrs...)
}
