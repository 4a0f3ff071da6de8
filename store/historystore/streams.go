package historystore

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/bus"
)

// Stream is the JetStream stream of rooms' recent messages (critical and normal lanes), one
// subject per room (Subject). Each entry is a HistoryRecord: the kept messages of one of the
// room's batch windows (RecordHeader). A room keeps its newest PerRoom messages unless the room
// service is configured otherwise: the stream keeps that many entries of the room, so at least
// that many messages, and Read trims to the newest that many. The room service writes it;
// ChatLinks read it to recover a reconnecting member's missed messages. PerRoom is also the most
// a login may ask for (Login.history).
//
// RoomSeqStream holds one JetStream counter per room (RoomSeqSubject): how many of the room's
// critical and normal messages have been numbered (Message.room_seq), so that a recovery can
// count the messages that are no longer kept.
const (
	Stream        = "rc_history"
	PerRoom       = 100
	RoomSeqStream = "rc_room_seq"
)

// Subject is a room's subject in Stream.
func Subject(app, room string) string { return "rc.history." + app + "." + room }

// RoomSeqSubject is a room's counter in RoomSeqStream.
func RoomSeqSubject(app, room string) string { return "rc.roomseq." + app + "." + room }

// CreateStreams creates Stream, keeping perRoom entries of each room for at most maxAge, and
// RoomSeqStream, or updates their configuration, with replicas copies each.
func CreateStreams(ctx context.Context, js jetstream.JetStream, replicas, perRoom int, maxAge time.Duration) error {
	_, err := bus.CreateOrUpdateStream(ctx, js, jetstream.StreamConfig{
		Name:              Stream,
		Description:       "Roomcast rooms' recent messages, for recovery after a reconnect",
		Subjects:          []string{Subject("*", "*")},
		MaxMsgsPerSubject: int64(perRoom),
		MaxAge:            maxAge,
		Discard:           jetstream.DiscardOld,
		Replicas:          replicas,
		// Readers (Read) use batched direct gets: no consumer per read.
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("historystore: history stream: %w", err)
	}
	// The counters are kept without an age limit: a room's numbers must not start again at 1
	// while a client still holds an older one.
	_, err = bus.CreateOrUpdateStream(ctx, js, jetstream.StreamConfig{
		Name:              RoomSeqStream,
		Description:       "Roomcast rooms' message counters (Message.room_seq)",
		Subjects:          []string{RoomSeqSubject("*", "*")},
		AllowMsgCounter:   true,
		MaxMsgsPerSubject: 1,
		Replicas:          replicas,
	})
	if err != nil {
		return fmt.Errorf("historystore: room_seq stream: %w", err)
	}
	return nil
}
