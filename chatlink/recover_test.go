package chatlink

import (
	"fmt"
	"testing"
	"time"

	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
)

// keptRoom returns a room's kept messages: ids in time order, numbered from first, and a
// message for class 2 at every seq in class2.
func keptRoom(first, n uint64, class2 ...uint64) []*clientpb.Message {
	var g ids.Generator
	at := time.UnixMilli(1764451200000)
	var out []*clientpb.Message
	for seq := first; seq < first+n; seq++ {
		m := &clientpb.Message{Id: g.New(at.Add(time.Duration(seq) * time.Millisecond)), RoomSeq: seq, Body: []byte(fmt.Sprint(seq))}
		for _, c := range class2 {
			if c == seq {
				m.TagExpr = "class2"
			}
		}
		out = append(out, m)
	}
	return out
}

func TestSelectHistory(t *testing.T) {
	full := keptRoom(1, 10)                          // the room's first 10: nothing was evicted
	evicted := keptRoom(96, 10)                      // 96..105: 95 evicted
	tagged := keptRoom(1, 5, 4)                      // 4 is for class 2
	gap := append(keptRoom(1, 3), keptRoom(5, 2)...) // 4 was numbered but never kept
	allowAll := func(*clientpb.Message) bool { return true }
	noClass2 := func(m *clientpb.Message) bool { return m.TagExpr == "" }
	// 4 was accepted (its id stamped) before 3 but numbered after it: two instances' windows.
	crossed := keptRoom(1, 5)
	crossed[2].Id, crossed[3].Id = crossed[3].Id, crossed[2].Id
	var g ids.Generator
	beforeAll := g.New(time.UnixMilli(1764451200000)) // older than any of these rooms' (a bulk message's, say)

	for _, tc := range []struct {
		name      string
		kept      []*clientpb.Message
		ask       historyAsk
		allow     func(*clientpb.Message) bool
		want      string // the bodies sent
		recovered bool
		missing   uint64
	}{
		{"since the 3rd, all kept", full, historyAsk{since: full[2].Id, sinceSeq: 3}, allowAll, "[4 5 6 7 8 9 10]", true, 0},
		{"since the newest: nothing to recover", full, historyAsk{since: full[9].Id, sinceSeq: 10}, allowAll, "[]", true, 0},
		{"an empty room", nil, historyAsk{since: beforeAll, sinceSeq: 0}, allowAll, "[]", true, 0},
		{"105 sent, 100 gone: 95 missing", evicted, historyAsk{since: beforeAll}, allowAll, "[96 97 98 99 100 101 102 103 104 105]", false, 0},
		{"since seq 90: 91..95 missing", evicted, historyAsk{since: beforeAll, sinceSeq: 90}, allowAll, "[96 97 98 99 100 101 102 103 104 105]", false, 5},
		{"since seq 95: nothing missing", evicted, historyAsk{since: beforeAll, sinceSeq: 95}, allowAll, "[96 97 98 99 100 101 102 103 104 105]", true, 0},
		{"a message not allowed is not missing", tagged, historyAsk{since: tagged[1].Id, sinceSeq: 2}, noClass2, "[3 5]", true, 0},
		{"without a seq, the first message still kept", full, historyAsk{since: beforeAll}, allowAll, "[1 2 3 4 5 6 7 8 9 10]", true, 0},
		{"without a seq, since is kept", evicted, historyAsk{since: evicted[3].Id}, allowAll, "[100 101 102 103 104 105]", true, 0},
		{"a gap in the numbers: a message never kept", gap, historyAsk{since: gap[0].Id, sinceSeq: 1}, allowAll, "[2 3 5 6]", false, 1},
		{"numbered after a later id: the numbers decide", crossed, historyAsk{since: crossed[2].Id, sinceSeq: 3}, allowAll, "[4 5]", true, 0},
		{"the last 3", full, historyAsk{last: 3}, allowAll, "[8 9 10]", true, 0},
		{"the last 3 this member may see", tagged, historyAsk{last: 3}, noClass2, "[2 3 5]", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, rec := selectHistory(tc.kept, tc.ask, tc.allow)
			var bodies []string
			for _, m := range out {
				bodies = append(bodies, string(m.Body))
			}
			if got := fmt.Sprint(bodies); got != tc.want {
				t.Errorf("sent %s, want %s", got, tc.want)
			}
			if rec.GetRecovered() != tc.recovered || rec.GetMissing() != tc.missing {
				t.Errorf("Recovery{recovered: %v, missing: %d}, want {%v, %d}", rec.GetRecovered(), rec.GetMissing(), tc.recovered, tc.missing)
			}
		})
	}
}

func TestCheckSince(t *testing.T) {
	var g ids.Generator
	now := time.UnixMilli(1764451200000)
	for _, tc := range []struct {
		since string
		ok    bool
	}{
		{g.New(now.Add(-time.Hour)), true},
		{g.New(now.Add(30 * time.Second)), true}, // another clock a little ahead
		{g.New(now.Add(time.Hour)), false},
		{"not-an-id", false},
		{"01KBZZZZZZZZZZZZZZZZZZZZZ!", false},
	} {
		if got := checkSince(tc.since, now); got != tc.ok {
			t.Errorf("checkSince(%q) = %v, want %v", tc.since, got, tc.ok)
		}
	}
}
