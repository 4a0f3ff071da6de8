package room

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// recordWindows records windows of messages of room "r" (sizes[i] messages in window i) with
// the service's history writer, the bodies numbered from first on, and returns the bodies.
func recordWindows(t *testing.T, s *Service, first int, sizes ...int) []string {
	t.Helper()
	var gen ids.Generator
	var bodies []string
	for _, n := range sizes {
		var msgs []*clientpb.Message
		for range n {
			body := strconv.Itoa(first + len(bodies))
			bodies = append(bodies, body)
			now := time.Now()
			msgs = append(msgs, &clientpb.Message{Id: gen.New(now), Room: "r", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(body), ServerTimeMs: now.UnixMilli()})
			// a bulk message between them, which history does not keep
			msgs = append(msgs, &clientpb.Message{Id: gen.New(now), Room: "r", Lane: clientpb.Lane_LANE_BULK, Body: []byte("bulk")})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.hist.record(ctx, "a", msgs, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return bodies
}

// historyEntries returns how many entries the history stream holds.
func historyEntries(t *testing.T, s *Service) uint64 {
	t.Helper()
	st, err := s.hist.js.Stream(context.Background(), historystore.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// page asks the service for a page of room "r"'s history.
func page(t *testing.T, s *Service, q *clientpb.HistoryQuery) *clientpb.HistoryPage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep := s.historyPage(ctx, &buspb.HistoryRequest{App: "a", Room: "r", Query: q})
	if rep.History == nil {
		t.Fatalf("%v: %v", q, rep)
	}
	return rep.History
}

// TestHistoryWindowIsOneEntry sends a batch of several messages: its window is one entry of the
// history stream, which reads back as the messages in order, at indexes 0, 1, ... of it.
func TestHistoryWindowIsOneEntry(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{BatchWindow: 50 * time.Millisecond})
	var reqs []*buspb.SendRequest
	for i := range 5 {
		reqs = append(reqs, &buspb.SendRequest{App: "a", Room: "r", Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte(strconv.Itoa(i))})
	}
	q, ok := s.SendLocalQueued(context.Background(), reqs)
	if !ok {
		t.Fatal("SendLocalQueued did not take the sends")
	}
	if rep := q.Reply(); rep.Code != 0 {
		t.Fatal(rep)
	}
	if n := historyEntries(t, s); n != 1 {
		t.Errorf("a window of 5 messages is %d entries of the history stream, want 1", n)
	}
	kept, _, err := historystore.Read(context.Background(), s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kept {
		if string(k.Msg.Body) != strconv.Itoa(i) || k.Index != i || k.Seq != kept[0].Seq {
			t.Errorf("kept[%d] = %s at (%d, %d)", i, k.Msg.Body, k.Seq, k.Index)
		}
	}
	if len(kept) != 5 {
		t.Errorf("read %d messages, want 5", len(kept))
	}
}

// TestHistoryRecordSizeCap records a window whose messages take more than recordMaxBytes: it is
// split into records of at most that, in order, and a message larger than it is a record alone.
func TestHistoryRecordSizeCap(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{})
	big := func(body string, size int) *clientpb.Message {
		return &clientpb.Message{Id: body, Room: "r", Lane: clientpb.Lane_LANE_NORMAL, Body: append([]byte(body+":"), bytes.Repeat([]byte("x"), size)...), ServerTimeMs: time.Now().UnixMilli()}
	}
	third := recordMaxBytes / 3
	// 0, 1: one record (two thirds); 2, 3: the next; 4: more than the cap, alone; 5: the last.
	msgs := []*clientpb.Message{big("0", third), big("1", third), big("2", third), big("3", third), big("4", recordMaxBytes+1), big("5", 10)}
	if err := s.hist.record(context.Background(), "a", msgs, nil); err != nil {
		t.Fatal(err)
	}
	if n := historyEntries(t, s); n != 4 {
		t.Errorf("the window is %d entries of the history stream, want 4", n)
	}
	kept, _, err := historystore.Read(context.Background(), s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range kept {
		got = append(got, fmt.Sprintf("%s@%d", k.Msg.Id, k.Index))
	}
	if want := []string{"0@0", "1@1", "2@0", "3@1", "4@0", "5@0"}; !slices.Equal(got, want) {
		t.Errorf("read %v, want %v", got, want)
	}
}

// TestHistoryRecordKeepsSenders: a record keeps the session that sent each kept message, in
// step with the messages when a bulk message between them is left out, and the history read
// gives them back; messages of the server API read back with no sender.
func TestHistoryRecordKeepsSenders(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{})
	msg := func(body string, lane clientpb.Lane) *clientpb.Message {
		return &clientpb.Message{Id: body, Room: "r", Lane: lane, Body: []byte(body), ServerTimeMs: time.Now().UnixMilli()}
	}
	ctx := context.Background()
	// One window from clients and the server API, a bulk message among them; one from the server API alone.
	msgs := []*clientpb.Message{msg("a", clientpb.Lane_LANE_NORMAL), msg("b", clientpb.Lane_LANE_BULK), msg("c", clientpb.Lane_LANE_CRITICAL), msg("d", clientpb.Lane_LANE_NORMAL)}
	if err := s.hist.record(ctx, "a", msgs, []string{"n-1", "n-2", "", "n-3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.hist.record(ctx, "a", []*clientpb.Message{msg("e", clientpb.Lane_LANE_NORMAL)}, []string{""}); err != nil {
		t.Fatal(err)
	}
	// A window whose senders are fewer than its messages: the rest have none.
	if err := s.hist.record(ctx, "a", []*clientpb.Message{msg("f", clientpb.Lane_LANE_NORMAL), msg("g", clientpb.Lane_LANE_NORMAL)}, []string{"n-4"}); err != nil {
		t.Fatal(err)
	}
	kept, _, err := historystore.Read(ctx, s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range kept {
		got = append(got, k.Msg.Id+"="+k.Sender)
	}
	if want := "a=n-1 c= d=n-3 e= f=n-4 g="; strings.Join(got, " ") != want {
		t.Errorf("read back %q, want %q", strings.Join(got, " "), want)
	}
}

// TestHistoryPagesAcrossRecords pages a history of records of several messages, and an entry of
// one message an older version wrote, with cursors in both directions and pages of 1 to 3
// messages: every message comes once, in order.
func TestHistoryPagesAcrossRecords(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{})
	bodies := recordWindows(t, s, 0, 3, 1, 4)
	// An entry as versions before records wrote: one Message, no header.
	legacy := &clientpb.Message{Id: new(ids.Generator).New(time.Now()), Room: "r", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(strconv.Itoa(len(bodies))), ServerTimeMs: time.Now().UnixMilli()}
	b, _ := proto.Marshal(legacy)
	if _, err := s.hist.js.Publish(context.Background(), historystore.Subject("a", "r"), b); err != nil {
		t.Fatal(err)
	}
	bodies = append(bodies, string(legacy.Body))
	bodies = append(bodies, recordWindows(t, s, len(bodies), 2, 3)...)
	if n := historyEntries(t, s); n != 6 {
		t.Fatalf("%d entries, want 6", n)
	}
	if got := bodiesOf(page(t, s, &clientpb.HistoryQuery{Limit: 100}).Messages); !slices.Equal(got, bodies) {
		t.Fatalf("history %v, want %v", got, bodies)
	}
	for limit := 1; limit <= 3; limit++ {
		for _, older := range []bool{true, false} {
			t.Run(fmt.Sprintf("limit %d older %v", limit, older), func(t *testing.T) {
				q := &clientpb.HistoryQuery{Limit: uint32(limit)}
				if !older {
					q.AfterId = "00000000000000000000000000" // the oldest on
				}
				var got []string
				for range 2 * len(bodies) {
					p := page(t, s, q)
					if older {
						got = append(bodiesOf(p.Messages), got...)
					} else {
						got = append(got, bodiesOf(p.Messages)...)
					}
					if p.NextCursor == "" {
						break
					}
					q = &clientpb.HistoryQuery{Limit: uint32(limit), Cursor: p.NextCursor}
				}
				if !slices.Equal(got, bodies) {
					t.Errorf("pages gave %v, want %v", got, bodies)
				}
			})
		}
	}
}

// A cursor of version 1 (a stream sequence only, before records) still pages: older than it is
// before its record, newer than it is after its whole record.
func TestHistoryCursorVersion1(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{})
	bodies := recordWindows(t, s, 0, 2, 3, 2)
	kept, _, err := historystore.Read(context.Background(), s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	middle := kept[2].Seq // the record of 2, 3 and 4
	v1 := func(older bool) string {
		b := []byte{1, 0}
		if older {
			b[1] = 1
		}
		return base64.RawURLEncoding.EncodeToString(binary.AppendUvarint(b, middle))
	}
	if got := bodiesOf(page(t, s, &clientpb.HistoryQuery{Cursor: v1(true)}).Messages); !slices.Equal(got, bodies[:2]) {
		t.Errorf("older than a version-1 cursor: %v, want %v", got, bodies[:2])
	}
	if got := bodiesOf(page(t, s, &clientpb.HistoryQuery{Cursor: v1(false)}).Messages); !slices.Equal(got, bodies[5:]) {
		t.Errorf("newer than a version-1 cursor: %v, want %v", got, bodies[5:])
	}
}

// TestHistoryKeepsNewestMessages: the stream keeps HistoryPerRoom records of a room, but a
// room's history is its newest HistoryPerRoom messages, in every read: pages (also of newer
// messages from an anchor), and a read without a count of its own (a recovery since an id).
func TestHistoryKeepsNewestMessages(t *testing.T) {
	t.Parallel()
	s, _, _ := startService(t, Config{HistoryPerRoom: 4})
	bodies := recordWindows(t, s, 0, 3, 3, 3)
	if n := historyEntries(t, s); n != 3 {
		t.Fatalf("%d entries, want 3", n)
	}
	newest := bodies[len(bodies)-4:]
	if got := bodiesOf(page(t, s, &clientpb.HistoryQuery{Limit: 100}).Messages); !slices.Equal(got, newest) {
		t.Errorf("history %v, want the newest 4: %v", got, newest)
	}
	after := page(t, s, &clientpb.HistoryQuery{Limit: 100, AfterId: "00000000000000000000000000"})
	if got := bodiesOf(after.Messages); !slices.Equal(got, newest) {
		t.Errorf("after the oldest id: %v, want the newest 4: %v", got, newest)
	}
	kept, _, err := historystore.Read(context.Background(), s.hist.js, "a", "r", historystore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 4 || string(kept[0].Msg.Body) != newest[0] {
		t.Errorf("a read without a count gave %d messages, want the newest 4", len(kept))
	}
}

func bodiesOf(ms []*clientpb.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Body)
	}
	return out
}
