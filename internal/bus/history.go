package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// HistoryRecordHeader marks an entry of HistoryStream that holds a buspb.HistoryRecord (a batch
// window's kept messages) rather than one clientpb.Message, as versions before records wrote and a
// stream may still hold after an upgrade. Its value is the room service's count retention
// (room.Config.HistoryPerRoom) when it wrote the record: the stream keeps that many entries of a
// room, each of one message or more, and ReadHistory trims what it reads to the newest that many
// messages, so a room's history stays the count of messages it is documented to be.
const HistoryRecordHeader = "Rc-History"

// KeptMessage is a message of a room's history and its position there: the sequence in
// HistoryStream of the entry that holds it and its index within that entry (0 for an entry of
// one message). Positions order the room's messages as they were kept and stay put while
// messages are added and dropped. Sender is the session that sent it, when its record says
// ("" for the server API's messages and for entries written before records kept senders).
type KeptMessage struct {
	Seq    uint64
	Index  int
	Msg    *clientpb.Message
	Sender string
}

// Compare orders k's position against the position (seq, index): -1 before it, 0 at it, +1
// after it.
func (k KeptMessage) Compare(seq uint64, index int) int {
	if c := cmp.Compare(k.Seq, seq); c != 0 {
		return c
	}
	return cmp.Compare(k.Index, index)
}

// HistoryRange says which of a room's kept messages ReadHistory reads. Zero value: all of them.
type HistoryRange struct {
	// Since: only messages stamped at or after it (a retention narrower than the stream's).
	Since time.Time
	// FromSeq: only messages of entries at or after this sequence of HistoryStream; reading
	// starts there.
	FromSeq uint64
	// Keep: of the messages read, only the newest Keep (0: all the room's count retention
	// allows, HistoryRecordHeader). The messages read are always the newest of the room (from a
	// sequence or a time on), so these are the room's newest Keep messages that lie in range: a
	// retention by count narrower than the stream's.
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
// entries from r.FromSeq or else r.Since, with no consumer to create and clean up, so reads
// leave nothing behind on the server however many logins and pages ask. Records are expanded
// into their messages. Entries that do not decode (only a publisher other than the room service
// could write one) are left out and counted in skipped, for the caller to log.
func ReadHistory(ctx context.Context, js jetstream.JetStream, app, room string, r HistoryRange) (kept []KeptMessage, skipped int, err error) {
	req := directGetRequest{Seq: r.FromSeq, NextFor: HistorySubject(app, room), Batch: historyBatch}
	if req.Seq == 0 {
		if r.Since.IsZero() {
			req.Seq = 1
		} else {
			req.StartTime = &r.Since
		}
	}
	retention := 0 // the newest record's HistoryRecordHeader
	keep := func(seq uint64, index int, m *clientpb.Message, sender string) {
		// The start time is when an entry was stored, a little after its messages were stamped.
		if !r.Since.IsZero() && m.ServerTimeMs < r.Since.UnixMilli() {
			return
		}
		kept = append(kept, KeptMessage{Seq: seq, Index: index, Msg: m, Sender: sender})
	}
	for {
		more, err := directGet(ctx, js.Conn(), req, func(seq uint64, entry *nats.Msg) {
			req.Seq, req.StartTime = seq+1, nil // where a next batch starts
			mark := entry.Header.Get(HistoryRecordHeader)
			if mark == "" { // one message, as versions before records wrote
				var m clientpb.Message
				if proto.Unmarshal(entry.Data, &m) != nil {
					skipped++
					return
				}
				keep(seq, 0, &m, "")
				return
			}
			var rec buspb.HistoryRecord
			if proto.Unmarshal(entry.Data, &rec) != nil {
				skipped++
				return
			}
			retention, _ = strconv.Atoi(mark)
			for i, m := range rec.Messages {
				var sender string
				if i < len(rec.SenderSessions) {
					sender = rec.SenderSessions[i]
				}
				keep(seq, i, m, sender)
			}
		})
		if err != nil {
			return kept, skipped, fmt.Errorf("bus: history of %s: %w", room, err)
		}
		if !more {
			break
		}
	}
	n := r.Keep
	if retention > 0 && (n == 0 || retention < n) {
		n = retention
	}
	if n > 0 && len(kept) > n {
		kept = kept[len(kept)-n:]
	}
	return kept, skipped, nil
}

// errDirectGet is a direct get's answer that is neither a message nor its end.
var errDirectGet = errors.New("direct get failed")

// directGet sends one batched direct get of HistoryStream and hands each entry to take, in
// order, on the caller's goroutine. more reports that the batch ended before the subject's
// messages did (by its size or the server's byte limit): ask again from after the last one.
//
// The answers come on the connection's reply mux (RequestAnswers), not on a subscription of
// the read's own.
func directGet(ctx context.Context, nc *nats.Conn, req directGetRequest, take func(seq uint64, entry *nats.Msg)) (more bool, err error) {
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

// directGetAnswer handles one message of a direct get's answer: a kept entry, handed to take,
// or a status that ends the answer (ended), with more and err for directGet to return.
func directGetAnswer(msg *nats.Msg, take func(seq uint64, entry *nats.Msg)) (ended, more bool, err error) {
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
	take(seq, msg)
	return false, false, nil
}
