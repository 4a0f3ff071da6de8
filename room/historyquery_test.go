package room

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

func TestHistoryCursorRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []historyCursor{{older: true, seq: 1}, {seq: 42, index: 3}, {older: true, seq: 1 << 62, index: 1 << 20}, {seq: 7, index: afterRecord}} {
		got, err := parseHistoryCursor(c.String())
		if err != nil || got != c {
			t.Errorf("%+v -> %q -> %+v, %v", c, c.String(), got, err)
		}
	}
	// Version 1, a sequence only: older than its record's first message, newer than its last.
	for s, want := range map[string]historyCursor{"AQEB": {older: true, seq: 1}, "AQAB": {seq: 1, index: afterRecord}} {
		if got, err := parseHistoryCursor(s); err != nil || got != want {
			t.Errorf("version 1 %q -> %+v, %v, want %+v", s, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "AQ", "AQEA", "AgEB", "AgEAAQ", "AQIB", "AQEBAQ", "AgEBAQE", "AgEBgICAgAg", "AwEBAQ", "!!!!"} {
		if c, err := parseHistoryCursor(bad); err == nil {
			t.Errorf("%q parsed as %+v", bad, c)
		}
	}
}

func FuzzHistoryCursor(f *testing.F) {
	f.Add(historyCursor{older: true, seq: 7, index: 2}.String())
	f.Add("AQEA")
	f.Add("AQAH")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseHistoryCursor(s)
		if err != nil {
			return
		}
		if again, err := parseHistoryCursor(c.String()); err != nil || again != c {
			t.Fatalf("%q: %+v does not round-trip: %+v, %v", s, c, again, err)
		}
	})
}

// TestSelectPage pages kept messages with gaps in their stream sequences (other rooms'
// messages) and a filter, in both directions, and checks that following the cursors yields
// every allowed message once.
func TestSelectPage(t *testing.T) {
	t.Parallel()
	var kept []historystore.KeptMessage
	for i := range 10 {
		kept = append(kept, historystore.KeptMessage{Seq: uint64(3*i + 5), Msg: &clientpb.Message{Id: fmt.Sprintf("%026d", i), Body: []byte(strconv.Itoa(i))}})
	}
	allow := func(m *clientpb.Message) bool { return string(m.Body) != "4" && string(m.Body) != "5" }
	want := []string{"0", "1", "2", "3", "6", "7", "8", "9"}
	for _, older := range []bool{true, false} {
		t.Run(fmt.Sprint("older ", older), func(t *testing.T) {
			r := historyRange{older: older, in: func(historystore.KeptMessage) bool { return true }}
			var got []string
			var sizes []int
			for range 10 {
				page := selectPage(kept, r, 3, allow)
				var bodies []string
				for _, m := range page.Messages {
					bodies = append(bodies, string(m.Body))
				}
				sizes = append(sizes, len(bodies))
				if older {
					got = append(bodies, got...)
				} else {
					got = append(got, bodies...)
				}
				if page.NextCursor == "" {
					break
				}
				q := &clientpb.HistoryQuery{Cursor: page.NextCursor}
				var rep *buspb.Reply
				if r, rep = rangeOf(q); rep != nil {
					t.Fatal(rep)
				}
			}
			if !slices.Equal(got, want) || !slices.Equal(sizes, []int{3, 3, 2}) {
				t.Errorf("pages of %v gave %v, want %v", sizes, got, want)
			}
		})
	}
}
