package room

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// DefaultHistoryMaxAge is how long a message stays in history unless Config.HistoryMaxAge says.
const DefaultHistoryMaxAge = 24 * time.Hour

// numberTimeout bounds one attempt at numbering a window's messages (and at recording them).
// Past it a window without critical messages goes out unnumbered (or unkept); one with critical
// messages tries again until criticalTimeout.
const numberTimeout = time.Second

// criticalTimeout bounds how long a window holding critical messages keeps trying to be
// numbered, kept and published (a NATS server restarting, the connection reconnecting) before
// it is given up, counted, and its critical senders are answered 503. It stays below the
// ChatLinks' request timeout (3s by default), so that a sender is not told of a timeout for a
// message that then goes out.
const criticalTimeout = 2 * time.Second

// history appends the rooms' critical and normal messages to the history stream, so a member
// that reconnects can recover what it missed, and numbers them (Message.room_seq) with a
// JetStream counter per room, so that a recovery can tell how many it can no longer give. Bulk
// danmaku are neither kept nor numbered.
//
// A window's kept messages are one entry of the stream (a buspb.HistoryRecord), not one each: one
// store, ack and file write per window, and in a cluster one raft proposal, however many
// messages it holds.
type history struct {
	js      jetstream.JetStream
	perRoom string // the count retention, historystore.RecordHeader of every record
	log     *slog.Logger
}

// recordMaxBytes is the most a history record's encoding takes, well under NATS's 1 MB
// default max payload: a window whose kept messages take more is split into several records
// (a single message larger than this is a record alone).
const recordMaxBytes = 256 << 10

func openHistory(ctx context.Context, nc *nats.Conn, replicas, perRoom int, maxAge time.Duration, log *slog.Logger) (*history, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
		log.Warn("message not kept in history", "subject", m.Subject, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("room: jetstream: %w", err)
	}
	if err := historystore.CreateStreams(ctx, js, replicas, perRoom, maxAge); err != nil {
		return nil, fmt.Errorf("room: %w", err)
	}
	return &history{js: js, perRoom: strconv.Itoa(perRoom), log: log}, nil
}

// number gives the kept messages of msgs (one room's) their room_seq, in order, with one
// increment of the room's counter, and returns an error if the counter did not answer within
// ctx (the messages then stay unnumbered, 0).
func (h *history) number(ctx context.Context, app, room string, msgs []*clientpb.Message) error {
	kept := 0
	for _, m := range msgs {
		if m.Lane != clientpb.Lane_LANE_BULK {
			kept++
		}
	}
	if kept == 0 {
		return nil
	}
	req := nats.NewMsg(historystore.RoomSeqSubject(app, room))
	req.Header.Set("Nats-Incr", "+"+strconv.Itoa(kept))
	ack, err := h.js.PublishMsg(ctx, req)
	var last uint64
	if err == nil {
		last, err = strconv.ParseUint(ack.Value, 10, 64)
	}
	if err != nil {
		return fmt.Errorf("room: number %s/%s: %w", app, room, err)
	}
	next := last - uint64(kept) + 1
	for _, m := range msgs {
		if m.Lane != clientpb.Lane_LANE_BULK {
			m.RoomSeq = next
			next++
		}
	}
	return nil
}

// record appends the kept messages of msgs (one room's) to its history, as records of at most
// recordMaxBytes, with the sessions that sent them (senders, parallel to msgs, may be shorter),
// and waits, within ctx, until JetStream has stored them all. It returns the first failure.
//
// A window is recorded before it is published live: a member that saw a message live, or that
// reconnects while it is on its way, must find it in the history its recovery reads.
func (h *history) record(ctx context.Context, app string, msgs []*clientpb.Message, senders []string) error {
	var acks []jetstream.PubAckFuture
	publish := func(rec *buspb.HistoryRecord) error {
		if len(rec.Messages) == 0 {
			return nil
		}
		room := rec.Messages[0].Room
		if !slices.ContainsFunc(rec.SenderSessions, func(s string) bool { return s != "" }) {
			rec.SenderSessions = nil // the server API's messages: nobody to leave out
		}
		b, err := proto.Marshal(rec)
		if err != nil {
			return fmt.Errorf("room: encode history record of %s/%s: %w", app, room, err)
		}
		m := nats.NewMsg(historystore.Subject(app, room))
		m.Header.Set(historystore.RecordHeader, h.perRoom)
		m.Data = b
		ack, err := h.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("room: keep messages of %s/%s: %w", app, room, err)
		}
		acks = append(acks, ack)
		return nil
	}
	rec, size := &buspb.HistoryRecord{}, 0
	for i, m := range msgs {
		if m.Lane == clientpb.Lane_LANE_BULK {
			continue
		}
		var sender string
		if i < len(senders) {
			sender = senders[i]
		}
		// A message's share of a record: its encoding and its sender's, each with its field's
		// tag and length.
		n := proto.Size(m)
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(n))
		n += protowire.SizeTag(2) + protowire.SizeBytes(len(sender))
		if size+n > recordMaxBytes && len(rec.Messages) > 0 {
			if err := publish(rec); err != nil {
				return err
			}
			rec, size = &buspb.HistoryRecord{}, 0
		}
		rec.Messages = append(rec.Messages, m)
		rec.SenderSessions = append(rec.SenderSessions, sender)
		size += n
	}
	if err := publish(rec); err != nil {
		return err
	}
	for _, ack := range acks {
		select {
		case <-ack.Ok():
		case err := <-ack.Err():
			return fmt.Errorf("room: keep messages of %s: %w", ack.Msg().Subject, err)
		case <-ctx.Done():
			return fmt.Errorf("room: keep messages of %s: %w", app, ctx.Err())
		}
	}
	return nil
}
