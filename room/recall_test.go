package room

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
)

// TestRecallCore: the room service's Recall, as a moderator's request path would call it
// (by_uid, no sender checks): the message leaves the history pages, the room's subject carries
// the Recall naming the moderator, the recall takes one history entry; a second recall is
// already_recalled, answered and broadcast again as the first was; an unkept id is recalled without being found, but not once it is over an
// hour old by the service's clock.
func TestRecallCore(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64 // how far the service's clock runs ahead
	s, _, nc := startService(t, Config{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	batches := roomBatches(t, nc, "r")
	bodies := recordWindows(t, s, 0, 3)
	kept := page(t, s, &clientpb.HistoryQuery{}).Messages
	if len(kept) != 3 {
		t.Fatalf("history holds %d messages, want 3", len(kept))
	}
	entries := historyEntries(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	gone := kept[1].Id
	rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: gone, ByUid: "assistant-1"})
	if rep.Code != 0 || rep.AlreadyRecalled || rep.Recalled.GetByUid() != "assistant-1" {
		t.Fatalf("recall: %v", rep)
	}
	select {
	case b := <-batches:
		if got := b.GetRecall().GetMessages(); len(got) != 1 || got[0].Id != gone || got[0].ByUid != "assistant-1" {
			t.Fatalf("the room's subject carried %v", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Recall on the room's subject")
	}
	var left []string
	for _, m := range page(t, s, &clientpb.HistoryQuery{}).Messages {
		left = append(left, string(m.Body))
	}
	if want := []string{bodies[0], bodies[2]}; !slices.Equal(left, want) {
		t.Errorf("history after the recall: %v, want %v", left, want)
	}
	if n := historyEntries(t, s); n != entries+1 {
		t.Errorf("the recall took %d history entries, want 1", n-entries)
	}
	// A second recall, by someone else, is answered with the first, which is broadcast again as
	// it was.
	first := rep.Recalled
	rep = s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: gone, ByUid: "assistant-2"})
	if rep.Code != 0 || !rep.AlreadyRecalled || rep.Recalled.GetByUid() != "assistant-1" || rep.Recalled.GetRecalledMs() != first.RecalledMs {
		t.Errorf("second recall: %v, want already_recalled with the first (%v)", rep, first)
	}
	select {
	case b := <-batches:
		if got := b.GetRecall().GetMessages(); len(got) != 1 || got[0].ByUid != "assistant-1" || got[0].RecalledMs != first.RecalledMs {
			t.Errorf("the second recall broadcast %v, want the first again", b)
		}
	case <-time.After(5 * time.Second):
		t.Error("the second recall broadcast nothing")
	}

	var gen ids.Generator
	unkept := gen.New(time.Now())
	if rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: unkept}); rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND) {
		t.Errorf("an id history does not hold, without unkept: %v, want 130", rep)
	}
	if rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: unkept, Unkept: true}); rep.Code != 0 {
		t.Errorf("an unkept recall: %v", rep)
	}
	old := gen.New(time.Now())
	offset.Store(int64(maxUnkeptRecallAge + time.Minute))
	if rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: old, Unkept: true}); rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND) {
		t.Errorf("an unkept recall over an hour old: %v, want 130", rep)
	}
	if rep := s.Recall(ctx, &buspb.RoomRecallRequest{App: "a", Room: "r", MessageId: "nope"}); rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST) {
		t.Errorf("a malformed id: %v, want 100", rep)
	}
}
