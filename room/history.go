package room

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// DefaultHistoryMaxAge is how long a message stays in history unless Config.HistoryMaxAge says.
const DefaultHistoryMaxAge = 24 * time.Hour

// numberTimeout bounds numbering a send's messages; past it they go out unnumbered.
const numberTimeout = time.Second

// history appends the rooms' critical and normal messages to the history stream, so a member
// that reconnects can recover what it missed, and numbers them (Message.room_seq) with a
// JetStream counter per room, so that a recovery can tell how many it can no longer give. Bulk
// danmaku are neither kept nor numbered.
type history struct {
	js  jetstream.JetStream
	log *slog.Logger
}

func openHistory(ctx context.Context, nc *nats.Conn, replicas, perRoom int, maxAge time.Duration, log *slog.Logger) (*history, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
		log.Warn("message not kept in history", "subject", m.Subject, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("room: jetstream: %w", err)
	}
	_, err = bus.CreateOrUpdateStream(ctx, js, jetstream.StreamConfig{
		Name:              bus.HistoryStream,
		Description:       "Roomcast rooms' recent messages, for recovery after a reconnect",
		Subjects:          []string{bus.HistorySubject("*", "*")},
		MaxMsgsPerSubject: int64(perRoom),
		MaxAge:            maxAge,
		Discard:           jetstream.DiscardOld,
		Replicas:          replicas,
		// Readers (bus.ReadHistory) use batched direct gets: no consumer per read.
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("room: history stream: %w", err)
	}
	// The counters are kept without an age limit: a room's numbers must not start again at 1
	// while a client still holds an older one.
	_, err = bus.CreateOrUpdateStream(ctx, js, jetstream.StreamConfig{
		Name:              bus.RoomSeqStream,
		Description:       "Roomcast rooms' message counters (Message.room_seq)",
		Subjects:          []string{bus.RoomSeqSubject("*", "*")},
		AllowMsgCounter:   true,
		MaxMsgsPerSubject: 1,
		Replicas:          replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("room: room_seq stream: %w", err)
	}
	return &history{js: js, log: log}, nil
}

// number gives the kept messages of msgs (one room's) their room_seq, in order, with one
// increment of the room's counter. If the counter does not answer in time the messages stay
// unnumbered (0) and are sent anyway: a recovery then counts them as missing, which they are
// not, rather than the room going quiet.
func (h *history) number(app, room string, msgs []*pb.Message) {
	kept := 0
	for _, m := range msgs {
		if m.Lane != pb.Lane_LANE_BULK {
			kept++
		}
	}
	if kept == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), numberTimeout)
	defer cancel()
	req := nats.NewMsg(bus.RoomSeqSubject(app, room))
	req.Header.Set("Nats-Incr", "+"+strconv.Itoa(kept))
	ack, err := h.js.PublishMsg(ctx, req)
	var last uint64
	if err == nil {
		last, err = strconv.ParseUint(ack.Value, 10, 64)
	}
	if err != nil {
		h.log.Warn("messages not numbered", "app", app, "room", room, "err", err)
		return
	}
	next := last - uint64(kept) + 1
	for _, m := range msgs {
		if m.Lane != pb.Lane_LANE_BULK {
			m.RoomSeq = next
			next++
		}
	}
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
