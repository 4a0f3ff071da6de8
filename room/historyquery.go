package room

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
	"roomcast/store/historystore"
)

// The history API: pages of a room's kept messages, for members (through their ChatLink) and
// the server API, asked on bus.SubjectRoomHistory. The messages are read with historystore.Read,
// the reader of login history and recovery; this file adds the room's retention, the paging and
// what a member may see.

// Page sizes of the history API.
const (
	DefaultHistoryPage = 50
	MaxHistoryPage     = 200
)

// historyReadTimeout bounds reading a room's history for one page.
const historyReadTimeout = 2 * time.Second

// historyCursor is a position in a room's history and the direction to page from it: a
// sequence of historystore.Stream and an index within the record there
// (historystore.KeptMessage), which stay where they are while messages are added and dropped,
// so the pages after it neither repeat nor skip a message.
type historyCursor struct {
	older bool // page towards older messages: those before the position; else newer: after it
	// The position (historystore.KeptMessage) of the last message of the previous page.
	seq   uint64
	index int
}

// afterRecord is the index of a version-1 cursor of newer messages, which names a stream
// sequence only: past every message of its record (a record of recordMaxBytes holds far fewer).
const afterRecord = math.MaxInt32

// cursorVersion starts every encoded cursor, so the encoding can change without a cursor of
// the old one being read wrongly. Version 1 (before history records) held a sequence only;
// version 2 adds the index.
const cursorVersion = 2

func (c historyCursor) String() string {
	b := []byte{cursorVersion, 0}
	if c.older {
		b[1] = 1
	}
	b = binary.AppendUvarint(b, c.seq)
	return base64.RawURLEncoding.EncodeToString(binary.AppendUvarint(b, uint64(c.index)))
}

var errBadCursor = errors.New("not a history cursor")

func parseHistoryCursor(s string) (historyCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 3 || (b[0] != 1 && b[0] != cursorVersion) || b[1] > 1 {
		return historyCursor{}, errBadCursor
	}
	version, c := b[0], historyCursor{older: b[1] == 1}
	seq, n := binary.Uvarint(b[2:])
	if n <= 0 || seq == 0 {
		return historyCursor{}, errBadCursor
	}
	c.seq, b = seq, b[2+n:]
	if version == 1 {
		// Older than the sequence: before its record's first message; newer: after its last.
		if len(b) != 0 {
			return historyCursor{}, errBadCursor
		}
		if !c.older {
			c.index = afterRecord
		}
		return c, nil
	}
	index, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) || index > afterRecord {
		return historyCursor{}, errBadCursor
	}
	c.index = int(index)
	return c, nil
}

// historyRange is what one page asks for: the direction, and which kept messages lie in range.
type historyRange struct {
	older bool
	in    func(historystore.KeptMessage) bool
	// Where reading may start, for a page of newer messages: the stream sequence of a cursor,
	// or a time before an after_id. Zero: at the room's oldest message.
	fromSeq  uint64
	fromTime time.Time
}

// maxStampSkew is how far a room service's clock, which stamps a message's id, may run ahead of
// the NATS server's, which stamps when it was stored: a read of the messages after an id starts
// that much before the id's time.
const maxStampSkew = time.Minute

// rangeOf checks a query's anchor (at most one of before_id, after_id, cursor) and returns its
// range, or the refusal.
func rangeOf(q *clientpb.HistoryQuery) (historyRange, *buspb.Reply) {
	bad := func(msg string) (historyRange, *buspb.Reply) {
		return historyRange{}, refuse(clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY, 0, msg)
	}
	anchors := 0
	for _, a := range []string{q.BeforeId, q.AfterId, q.Cursor} {
		if a != "" {
			anchors++
		}
	}
	switch {
	case anchors > 1:
		return bad("give at most one of before_id, after_id and cursor")
	case q.Lane != clientpb.Lane_LANE_UNSPECIFIED && q.Lane != clientpb.Lane_LANE_CRITICAL && q.Lane != clientpb.Lane_LANE_NORMAL:
		return bad("lane must be critical or normal (bulk messages are not kept)")
	case q.BeforeId != "":
		if _, ok := ids.MessageTime(q.BeforeId); !ok {
			return bad("before_id is not a message id")
		}
		return historyRange{older: true, in: func(k historystore.KeptMessage) bool { return k.Msg.Id < q.BeforeId }}, nil
	case q.AfterId != "":
		at, ok := ids.MessageTime(q.AfterId)
		if !ok {
			return bad("after_id is not a message id")
		}
		return historyRange{in: func(k historystore.KeptMessage) bool { return k.Msg.Id > q.AfterId }, fromTime: at.Add(-maxStampSkew)}, nil
	case q.Cursor != "":
		c, err := parseHistoryCursor(q.Cursor)
		if err != nil {
			return bad("cursor is not one a history page gave")
		}
		if c.older {
			return historyRange{older: true, in: func(k historystore.KeptMessage) bool { return k.Compare(c.seq, c.index) < 0 }}, nil
		}
		return historyRange{in: func(k historystore.KeptMessage) bool { return k.Compare(c.seq, c.index) > 0 }, fromSeq: c.seq}, nil
	}
	return historyRange{older: true, in: func(historystore.KeptMessage) bool { return true }}, nil
}

// historyRetention is how many messages a room's history keeps and for how long: its settings
// where they ask for less than the deployment, the deployment's otherwise.
func (s *Service) historyRetention(st *roompb.RoomSettings) (keep int, age time.Duration) {
	keep, age = s.cfg.HistoryPerRoom, s.cfg.HistoryMaxAge
	if n := int(st.GetHistoryMaxMessages()); n > 0 && n < keep {
		keep = n
	}
	if a := time.Duration(st.GetHistoryMaxAgeS()) * time.Second; a > 0 && a < age {
		age = a
	}
	return keep, age
}

// selectPage takes from the messages in range that allow lets through the limit nearest the
// anchor, oldest first, with the cursor to the next page when more lie beyond them.
func selectPage(kept []historystore.KeptMessage, r historyRange, limit int, allow func(*clientpb.Message) bool) *clientpb.HistoryPage {
	ok := func(k historystore.KeptMessage) bool { return r.in(k) && allow(k.Msg) }
	var picked []historystore.KeptMessage
	more := false
	if r.older {
		for i := len(kept) - 1; i >= 0; i-- {
			if !ok(kept[i]) {
				continue
			}
			if len(picked) == limit {
				more = true
				break
			}
			picked = append(picked, kept[i])
		}
		slices.Reverse(picked)
	} else {
		for _, k := range kept {
			if !ok(k) {
				continue
			}
			if len(picked) == limit {
				more = true
				break
			}
			picked = append(picked, k)
		}
	}
	page := &clientpb.HistoryPage{Messages: make([]*clientpb.Message, len(picked))}
	for i, k := range picked {
		page.Messages[i] = k.Msg
	}
	if more {
		edge := picked[len(picked)-1]
		if r.older {
			edge = picked[0]
		}
		page.NextCursor = historyCursor{older: r.older, seq: edge.Seq, index: edge.Index}.String()
	}
	return page
}

func (s *Service) onHistory(msg *nats.Msg) {
	start := time.Now()
	var req buspb.HistoryRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opHistory, start, rep)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyReadTimeout)
	defer cancel()
	s.respond(msg, opHistory, start, s.historyPage(ctx, &req))
}

// historyPage answers a history request: the page, or the refusal.
func (s *Service) historyPage(ctx context.Context, req *buspb.HistoryRequest) *buspb.Reply {
	q := req.Query
	if q == nil {
		q = &clientpb.HistoryQuery{}
	}
	r, rep := rangeOf(q)
	if rep != nil {
		return rep
	}
	limit := int(q.Limit)
	if limit == 0 {
		limit = DefaultHistoryPage
	}
	limit = min(limit, MaxHistoryPage)

	keep, age := s.historyRetention(s.cache.room(req.App, req.Room).GetSettings())
	// A page of newer messages starts reading at its anchor: the newest keep messages from
	// there on are those of the room's newest keep that lie there.
	read := historystore.Range{Since: s.cfg.Now().Add(-age), FromSeq: r.fromSeq, Keep: keep}
	if r.fromTime.After(read.Since) {
		read.Since = r.fromTime
	}
	kept, skipped, err := historystore.Read(ctx, s.hist.js, req.App, req.Room, read)
	if skipped > 0 {
		s.log.Warn("kept messages that do not decode left out of a history page", "app", req.App, "room", req.Room, "skipped", skipped)
	}
	if err != nil {
		s.log.Warn("history not read", "app", req.App, "room", req.Room, "err", err)
		return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the room's history could not be read")
	}
	allow := func(m *clientpb.Message) bool {
		if q.Lane != clientpb.Lane_LANE_UNSPECIFIED && m.Lane != q.Lane {
			return false
		}
		if !req.AsMember || m.TagExpr == "" {
			return true
		}
		e, err := s.exprs.Get(m.TagExpr)
		return err == nil && e.EvalTags(req.Tags, req.Uid)
	}
	page := selectPage(kept, r, limit, allow)
	page.Seq = q.Seq
	return &buspb.Reply{History: page}
}
