// Package historystore defines the rooms' history in JetStream: the stream of their recent
// messages (Stream, one subject per room, entries in the record format of RecordHeader) and the
// stream of their message counters (RoomSeqStream), with how they are created (CreateStreams)
// and read (Read). The room service writes them; the ChatLinks and the room service read them.
// It must not write a room's messages nor number them: that is the room service's.
package historystore

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// RecordHeader marks an entry of Stream that holds a buspb.HistoryRecord (a batch
// window's kept messages) rather than one clientpb.Message, as versions before records wrote and a
// stream may still hold after an upgrade. Its value is the room service's count retention
// (room.Config.PerRoom) when it wrote the record: the stream keeps that many entries of a
// room, each of one message or more, and Read trims what it reads to the newest that many
// messages, so a room's history stays the count of messages it is documented to be.
const RecordHeader = "Rc-History"

// KeptMessage is a message of a room's history and its position there: the sequence in
// Stream of the entry that holds it and its index within that entry (0 for an entry of
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

// Range says which of a room's kept messages Read reads. Zero value: all of them.
type Range struct {
	// Since: only messages stamped at or after it (a retention narrower than the stream's).
	Since time.Time
	// FromSeq: only messages of entries at or after this sequence of Stream; reading
	// starts there.
	FromSeq uint64
	// Keep: of the messages read, only the newest Keep (0: all the room's count retention
	// allows, RecordHeader). The messages read are always the newest of the room (from a
	// sequence or a time on), so these are the room's newest Keep messages that lie in range: a
	// retention by count narrower than the stream's.
	Keep int
}

// historyBatch is how many messages one direct get asks for; a room holding more takes several.
// A variable for the tests.
var historyBatch = 1000

// Read reads the messages Stream keeps for a room that lie in r, oldest first,
// with batched direct gets (the stream allows direct access): one request per historyBatch
// entries from r.FromSeq or else r.Since, with no consumer to create and clean up, so reads
// leave nothing behind on the server however many logins and pages ask. Records are expanded
// into their messages. Entries that do not decode (only a publisher other than the room service
// could write one) are left out and counted in skipped, for the caller to log.
func Read(ctx context.Context, js jetstream.JetStream, app, room string, r Range) (kept []KeptMessage, skipped int, err error) {
	req := bus.DirectGetRequest{Seq: r.FromSeq, NextFor: Subject(app, room), Batch: historyBatch}
	if req.Seq == 0 {
		if r.Since.IsZero() {
			req.Seq = 1
		} else {
			req.StartTime = &r.Since
		}
	}
	retention := 0 // the newest record's RecordHeader
	keep := func(seq uint64, index int, m *clientpb.Message, sender string) {
		// The start time is when an entry was stored, a little after its messages were stamped.
		if !r.Since.IsZero() && m.ServerTimeMs < r.Since.UnixMilli() {
			return
		}
		kept = append(kept, KeptMessage{Seq: seq, Index: index, Msg: m, Sender: sender})
	}
	for {
		more, err := bus.DirectGet(ctx, js.Conn(), Stream, req, func(seq uint64, entry *nats.Msg) {
			req.Seq, req.StartTime = seq+1, nil // where a next batch starts
			mark := entry.Header.Get(RecordHeader)
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
			return kept, skipped, fmt.Errorf("historystore: history of %s: %w", room, err)
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
