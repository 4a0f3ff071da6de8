package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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

// historyBatch is how many messages one direct get asks for; a room holding more takes several.
// A variable for the tests.
var historyBatch = 1000

// directGetRequest is a batched direct get of JetStream (ADR-31, nats-server 2.11+): the
// stream's messages on a subject from a sequence or a time, as many as batch, answered by a
// stream of messages that ends with an end-of-batch status.
type directGetRequest struct {
	Seq       uint64     `json:"seq,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	NextFor   string     `json:"next_by_subj"`
	Batch     int        `json:"batch"`
}

// ReadHistory reads the messages HistoryStream keeps for a room that lie in r, oldest first,
// with batched direct gets (the stream allows direct access): one request per historyBatch
// messages from r.FromSeq or else r.Since, with no consumer to create and clean up, so reads
// leave nothing behind on the server however many logins and pages ask. Messages that do not
// decode (only a publisher other than the room service could write one) are left out and
// counted in skipped, for the caller to log.
func ReadHistory(ctx context.Context, js jetstream.JetStream, app, room string, r HistoryRange) (kept []KeptMessage, skipped int, err error) {
	req := directGetRequest{Seq: r.FromSeq, NextFor: HistorySubject(app, room), Batch: historyBatch}
	if req.Seq == 0 {
		if r.Since.IsZero() {
			req.Seq = 1
		} else {
			req.StartTime = &r.Since
		}
	}
	for {
		more, err := directGet(ctx, js.Conn(), req, func(seq uint64, data []byte) {
			req.Seq, req.StartTime = seq+1, nil // where a next batch starts
			var m pb.Message
			if proto.Unmarshal(data, &m) != nil {
				skipped++
				return
			}
			// The start time is when a message was stored, a little after it was stamped.
			if !r.Since.IsZero() && m.ServerTimeMs < r.Since.UnixMilli() {
				return
			}
			kept = append(kept, KeptMessage{Seq: seq, Msg: &m})
		})
		if err != nil {
			return kept, skipped, fmt.Errorf("bus: history of %s: %w", room, err)
		}
		if !more {
			break
		}
	}
	if r.Keep > 0 && len(kept) > r.Keep {
		kept = kept[len(kept)-r.Keep:]
	}
	return kept, skipped, nil
}

// errDirectGet is a direct get's answer that is neither a message nor its end.
var errDirectGet = errors.New("direct get failed")

// directGet sends one batched direct get of HistoryStream and hands each message to take, in
// order, on the caller's goroutine. more reports that the batch ended before the subject's
// messages did (by its size or the server's byte limit): ask again from after the last one.
//
// The answers come on the connection's reply mux (RequestAnswers), not on a subscription of
// the read's own.
func directGet(ctx context.Context, nc *nats.Conn, req directGetRequest, take func(seq uint64, data []byte)) (more bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return false, err
	}
	var answerErr error
	err = RequestAnswers(ctx, nc, "$JS.API.DIRECT.GET."+HistoryStream, body, func(msg *nats.Msg) bool {
		var ended bool
		ended, more, answerErr = directGetAnswer(msg, take)
		return ended
	})
	if err != nil {
		return false, err
	}
	return more, answerErr
}

// directGetAnswer handles one message of a direct get's answer: a kept message, handed to take,
// or a status that ends the answer (ended), with more and err for directGet to return.
func directGetAnswer(msg *nats.Msg, take func(seq uint64, data []byte)) (ended, more bool, err error) {
	if status := msg.Header.Get("Status"); len(msg.Data) == 0 && status != "" {
		switch status {
		case "404": // nothing from there on
			return true, false, nil
		case "204": // the end of the batch
			pending, _ := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
			return true, pending > 0, nil
		case "503":
			return true, false, fmt.Errorf("%w: no server answers direct gets of %s", errDirectGet, HistoryStream)
		default:
			return true, false, fmt.Errorf("%w: status %s %s", errDirectGet, status, msg.Header.Get("Description"))
		}
	}
	seq, err := strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return true, false, fmt.Errorf("%w: a message without its sequence", errDirectGet)
	}
	take(seq, msg.Data)
	return false, false, nil
}
