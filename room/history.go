package room

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// historyMaxAge is how long a message stays recoverable.
const historyMaxAge = 24 * time.Hour

// history appends the rooms' critical and normal messages to the history stream, so a member
// that reconnects can recover what it missed. Bulk danmaku are not kept.
type history struct {
	js  jetstream.JetStream
	log *slog.Logger
}

func openHistory(ctx context.Context, nc *nats.Conn, replicas int, log *slog.Logger) (*history, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
		log.Warn("message not kept in history", "subject", m.Subject, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("room: jetstream: %w", err)
	}
	if replicas <= 0 {
		replicas = 1
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              bus.HistoryStream,
		Description:       "Roomcast rooms' recent messages, for recovery after a reconnect",
		Subjects:          []string{bus.HistorySubject("*", "*")},
		MaxMsgsPerSubject: bus.HistoryPerRoom,
		MaxAge:            historyMaxAge,
		Discard:           jetstream.DiscardOld,
		Replicas:          replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("room: history stream: %w", err)
	}
	return &history{js: js, log: log}, nil
}

// record appends m to its room's history without waiting for the acknowledgement: a message
// that fails to be kept is still delivered live, and the failure is logged.
func (h *history) record(app string, m *pb.Message) {
	if m.Lane == pb.Lane_LANE_BULK {
		return
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return
	}
	if _, err := h.js.PublishAsync(bus.HistorySubject(app, m.Room), b); err != nil {
		h.log.Warn("message not kept in history", "room", m.Room, "id", m.Id, "err", err)
	}
}
