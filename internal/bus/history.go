package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
)

// KeptMessage is a message of a room's history and its sequence in HistoryStream, which orders
// the room's messages as they were kept and names a position that stays put while messages are
// added and dropped.
type KeptMessage struct {
	Seq uint64
	Msg *pb.Message
}

// HistoryRange says which of a room's kept messages ReadHistory reads. Zero value: all of them.
type HistoryRange struct {
	// Since: only messages stamped at or after it (a retention narrower than the stream's).
	Since time.Time
	// FromSeq: only messages at or after this sequence of HistoryStream; reading starts there.
	FromSeq uint64
	// Keep: of the messages read, only the newest Keep (0: all). Meaningful only when the read
	// starts at the room's oldest message (FromSeq 0): a retention by count narrower than the
	// stream's.
	Keep int
}

// ReadHistory reads the messages HistoryStream keeps for a room that lie in r, oldest first. It
// reads the room's subject with an ordered consumer filtered on it, starting at r.FromSeq or
// else r.Since, and asks for no more than the subject holds, so it never waits for messages to
// come. Messages that do not decode (only a publisher other than the room service
// could write one) are left out and counted in skipped, for the caller to log.
func ReadHistory(ctx context.Context, js jetstream.JetStream, app, room string, r HistoryRange) (kept []KeptMessage, skipped int, err error) {
	subject := HistorySubject(app, room)
	stream, err := js.Stream(ctx, HistoryStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, 0, nil // nothing was ever sent
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bus: history stream: %w", err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, 0, fmt.Errorf("bus: history of %s: %w", room, err)
	}
	count := int(info.State.Subjects[subject])
	if count == 0 {
		return nil, 0, nil
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}
	switch {
	case r.FromSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.FromSeq
	case !r.Since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &r.Since
	}
	cons, err := js.OrderedConsumer(ctx, HistoryStream, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: history of %s: %w", room, err)
	}
	// From a start fewer than count may follow: FetchNoWait hands what there is and
	// returns, where Fetch would wait for the rest until its deadline.
	batch, err := cons.FetchNoWait(count)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: history of %s: %w", room, err)
	}
	kept = make([]KeptMessage, 0, count)
	for msg := range batch.Messages() {
		var m pb.Message
		meta, err := msg.Metadata()
		if err != nil || proto.Unmarshal(msg.Data(), &m) != nil {
			skipped++
			continue
		}
		// The stream's start time is when a message was stored, a little after it was stamped.
		if !r.Since.IsZero() && m.ServerTimeMs < r.Since.UnixMilli() {
			continue
		}
		kept = append(kept, KeptMessage{Seq: meta.Sequence.Stream, Msg: &m})
	}
	if err := batch.Error(); err != nil {
		return kept, skipped, fmt.Errorf("bus: history of %s: %w", room, err)
	}
	if r.Keep > 0 && len(kept) > r.Keep {
		kept = kept[len(kept)-r.Keep:]
	}
	return kept, skipped, nil
}
