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
	"slices"
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

// RecallHeader marks an entry of Stream that holds a buspb.RecallRecord: the messages it names
// were recalled and have left the room's history. Read leaves them out; Find reports them. A
// recall's entry comes after the messages it names (a message is recalled once it is kept), so
// every read that reaches a message reaches its recall too.
const RecallHeader = "Rc-Recall"

// RecentRecallAge is how long a room in CDN mode repeats a recall to new logins, after their
// LoginAck: a new client starts polling at the current segment, which may hold a message
// recalled a moment ago (a segment is polled within a window or two of its start, 1 s each by
// default).
const RecentRecallAge = 10 * time.Second

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
	// Recalled: a recall took the message out of the history (RecallHeader). Read returns
	// such messages only with Range.Recalled, to count them, never to deliver them.
	Recalled bool
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
	// Recalled: return the recalled messages too, marked KeptMessage.Recalled, where they
	// were (a recovery counts their numbers as not missing). They count toward Keep.
	Recalled bool
}

// historyBatch is how many messages one direct get asks for; a room holding more takes several.
// A variable for the tests.
var historyBatch = 1000

// Read reads the messages Stream keeps for a room that lie in r, oldest first,
// with batched direct gets (the stream allows direct access): one request per historyBatch
// entries from r.FromSeq or else r.Since, with no consumer to create and clean up, so reads
// leave nothing behind on the server however many logins and pages ask. Records are expanded
// into their messages; recalled messages (RecallHeader) are left out. Entries that do not decode (only a publisher other than the room service
// could write one) are left out and counted in skipped, for the caller to log.
func Read(ctx context.Context, js jetstream.JetStream, app, room string, r Range) (kept []KeptMessage, skipped int, err error) {
	kept, recalled, retention, skipped, err := read(ctx, js, app, room, r)
	if err != nil {
		return kept, skipped, err
	}
	n := r.Keep
	if retention > 0 && (n == 0 || retention < n) {
		n = retention
	}
	if n > 0 && len(kept) > n {
		kept = kept[len(kept)-n:]
	}
	// Recalled messages still count toward the retention: they were kept, then taken out.
	if len(recalled) > 0 {
		if r.Recalled {
			for i := range kept {
				kept[i].Recalled = recalled[kept[i].Msg.GetId()] != nil
			}
		} else {
			kept = slices.DeleteFunc(kept, func(k KeptMessage) bool { return recalled[k.Msg.GetId()] != nil })
		}
	}
	return kept, skipped, nil
}

// Find looks for the message id among the messages Stream keeps for a room, reading from a
// minute before the time its id carries: the message as kept (recalled or not, while the
// stream holds it), and the first recall stored for it, if any. Neither: the room's history
// does not hold it.
func Find(ctx context.Context, js jetstream.JetStream, app, room, id string, at time.Time) (kept *KeptMessage, recall *clientpb.RecalledMessage, err error) {
	all, gone, _, _, err := read(ctx, js, app, room, Range{Since: at.Add(-time.Minute)})
	if err != nil {
		return nil, nil, err
	}
	for i := range all {
		if all[i].Msg.GetId() == id {
			kept = &all[i]
			kept.Recalled = gone[id] != nil
			break
		}
	}
	return kept, gone[id], nil
}

// Recalls returns the recalls stored for a room since a time, oldest first, as the members are
// told of them.
func Recalls(ctx context.Context, js jetstream.JetStream, app, room string, since time.Time) ([]*clientpb.RecalledMessage, error) {
	req := bus.DirectGetRequest{NextFor: Subject(app, room), Batch: historyBatch, StartTime: &since}
	var out []*clientpb.RecalledMessage
	for {
		more, err := bus.DirectGet(ctx, js.Conn(), Stream, req, func(seq uint64, entry *nats.Msg) {
			req.Seq, req.StartTime = seq+1, nil
			if entry.Header.Get(RecallHeader) == "" {
				return
			}
			var rec buspb.RecallRecord
			if proto.Unmarshal(entry.Data, &rec) != nil {
				return
			}
			for _, id := range rec.MessageIds {
				out = append(out, &clientpb.RecalledMessage{Id: id, RecalledMs: rec.RecalledMs, ByUid: rec.ByUid})
			}
		})
		if err != nil {
			return out, fmt.Errorf("historystore: recalls of %s: %w", room, err)
		}
		if !more {
			return out, nil
		}
	}
}

// read reads the entries of a room that lie in r: their messages, not trimmed to a retention,
// the recalls among them by the ids they name, the room's count retention (the newest record's
// RecordHeader, 0 if none said) and the count of entries that did not decode.
func read(ctx context.Context, js jetstream.JetStream, app, room string, r Range) (kept []KeptMessage, recalled map[string]*clientpb.RecalledMessage, retention, skipped int, err error) {
	req := bus.DirectGetRequest{Seq: r.FromSeq, NextFor: Subject(app, room), Batch: historyBatch}
	if req.Seq == 0 {
		if r.Since.IsZero() {
			req.Seq = 1
		} else {
			req.StartTime = &r.Since
		}
	}
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
			if entry.Header.Get(RecallHeader) != "" {
				var rec buspb.RecallRecord
				if proto.Unmarshal(entry.Data, &rec) != nil {
					skipped++
					return
				}
				if recalled == nil {
					recalled = make(map[string]*clientpb.RecalledMessage, len(rec.MessageIds))
				}
				for _, id := range rec.MessageIds {
					if recalled[id] == nil { // the first recall stands
						recalled[id] = &clientpb.RecalledMessage{Id: id, RecalledMs: rec.RecalledMs, ByUid: rec.ByUid}
					}
				}
				return
			}
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
			return kept, recalled, retention, skipped, fmt.Errorf("historystore: history of %s: %w", room, err)
		}
		if !more {
			break
		}
	}
	return kept, recalled, retention, skipped, nil
}
