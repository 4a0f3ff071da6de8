package chatlink_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
)

// TestNoticeOffset: a room's moment within a notice's spread depends on the notice and the room
// alone (so every node picks the same), lies within the spread, and the moments of many rooms
// spread evenly over it.
func TestNoticeOffset(t *testing.T) {
	t.Parallel()
	const spread, rooms, buckets = time.Second, 10000, 10
	var count [buckets]int
	for i := range rooms {
		room := fmt.Sprintf("room-%d", i)
		at := chatlink.NoticeOffset("01KB0000000000000000000001", room, spread)
		if at < 0 || at >= spread {
			t.Fatalf("%s: offset %v outside [0, %v)", room, at, spread)
		}
		if again := chatlink.NoticeOffset("01KB0000000000000000000001", room, spread); again != at {
			t.Fatalf("%s: offset %v, then %v", room, at, again)
		}
		count[at*buckets/spread]++
	}
	for i, k := range count {
		if k < rooms/buckets*8/10 || k > rooms/buckets*12/10 {
			t.Errorf("tenth %d of the spread holds %d rooms of %d: %v", i, k, rooms, count)
		}
	}
	if chatlink.NoticeOffset("01KB0000000000000000000001", "r", 0) != 0 {
		t.Error("no spread: a room's moment is not 0")
	}
}

// TestNoticeSpread: a ChatLink writes an app-wide notice to each of its rooms no sooner than
// the room's moment within the spread, so the rooms do not all get it at once; every room gets
// it. Only lower bounds are checked: a busy machine delivers late, never early.
func TestNoticeSpread(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	const rooms, spread = 16, 800 * time.Millisecond
	clients := make([]*testkit.Client, rooms)
	for i := range clients {
		clients[i] = testkit.DialTCP(t, c.Nodes[0].TCPAddr())
		if f := clients[i].LoginAs(testcluster.Token(t, fmt.Sprintf("u%d", i), fmt.Sprintf("room-%d", i)), "web"); f.GetLoginAck() == nil {
			t.Fatalf("login %d: %v", i, f)
		}
	}
	arrived := make([]time.Time, rooms)
	ids := make([]string, rooms)
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Go(func() {
			deadline := time.After(testkit.NextTimeout + spread)
			for {
				select {
				case f := <-cl.Frames():
					if p := f.GetPush(); p != nil && len(p.Messages) > 0 {
						arrived[i], ids[i] = time.Now(), p.Messages[0].Id
						return
					}
				case <-deadline:
					return
				}
			}
		})
	}
	start := time.Now()
	var out struct {
		ID string `json:"id"`
	}
	if code := testcluster.Call(t, c, "POST", "/v1/rooms/messages", devcluster.APIKey, fmt.Sprintf(`{"body":"notice","spread_ms":%d}`, spread.Milliseconds()), &out); code != 200 {
		t.Fatalf("POST /v1/rooms/messages: HTTP %d", code)
	}
	wg.Wait()
	var first, last time.Duration = spread, 0
	for i := range rooms {
		room := fmt.Sprintf("room-%d", i)
		if ids[i] != out.ID {
			t.Errorf("%s: got %q, want the notice %s", room, ids[i], out.ID)
			continue
		}
		at := chatlink.NoticeOffset(out.ID, room, spread)
		if got := arrived[i].Sub(start); got < at {
			t.Errorf("%s: the notice came %v after the call, before its moment %v", room, got, at)
		}
		first, last = min(first, at), max(last, at)
	}
	t.Logf("the rooms' moments run from %v to %v of %v", first, last, spread)
}
