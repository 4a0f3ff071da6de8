package chatlink

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// recoverTimeout bounds reading a room's history for one login.
const recoverTimeout = 2 * time.Second

// recoverHistory sends a member, after its LoginAck, the room's kept messages it asked for:
// those after since (a message id), or else the last n. Only the messages the member's tags
// allow are sent, in one Push marked recovered.
func (n *Node) recoverHistory(c *conn, since string, last int) {
	ctx, cancel := context.WithTimeout(n.ctx, recoverTimeout)
	defer cancel()
	msgs, err := n.history(ctx, c.app, c.room)
	if err != nil {
		n.log.Warn("history not read", "session", c.session, "err", err)
		return
	}
	set := c.tags.Load()
	if set == nil {
		return // closed meanwhile
	}
	var out []*pb.Message
	for _, m := range msgs {
		if since != "" && m.Id <= since {
			continue
		}
		if m.TagExpr != "" && !n.expr(m.TagExpr).Eval(set, c.uid) {
			continue
		}
		out = append(out, m)
	}
	if since == "" && len(out) > last {
		out = out[len(out)-last:]
	}
	for _, b := range pushFrames(out, true) {
		c.write(b)
	}
}

// history reads the messages kept for a room, oldest first.
func (n *Node) history(ctx context.Context, app, room string) ([]*pb.Message, error) {
	subject := bus.HistorySubject(app, room)
	stream, err := n.js.Stream(ctx, bus.HistoryStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil // nothing was ever sent
	}
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	count := int(info.State.Subjects[subject])
	if count == 0 {
		return nil, nil
	}
	cons, err := n.js.OrderedConsumer(ctx, bus.HistoryStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, err
	}
	batch, err := cons.Fetch(count, jetstream.FetchMaxWait(recoverTimeout))
	if err != nil {
		return nil, err
	}
	out := make([]*pb.Message, 0, count)
	for msg := range batch.Messages() {
		var m pb.Message
		if err := proto.Unmarshal(msg.Data(), &m); err == nil {
			out = append(out, &m)
		}
	}
	return out, batch.Error()
}
