package loadgen

import (
	"context"
	"sync"
	"time"

	"roomcast/proto/clientpb"
)

// likes are the members' taps of the room's counter "like" (bench upload --likes): counted by
// the server, never carried (docs/protocol.md, "Counters"). The bench taps, counts the refusals,
// and checks that the total every member ends up seeing equals the likes the server took.
type likes struct {
	mu      sync.Mutex // guards the fields below
	sent    int64
	refused map[string]int64
}

func newLikes() *likes { return &likes{refused: map[string]int64{}} }

func (l *likes) refuse(code uint32) {
	l.mu.Lock()
	l.refused[clientpb.ErrorCode(code).String()]++
	l.mu.Unlock()
}

// counted returns the likes sent less those refused: what the members' totals must come to.
func (l *likes) counted() (sent, refused int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.refused {
		refused += n
	}
	return l.sent, refused
}

// tapLikes has every member tap perSec likes a second for duration, the taps of the members
// spread evenly over the time; it returns after the last one (or when ctx ends).
func tapLikes(ctx context.Context, members []*rawClient, l *likes, perSec float64, duration time.Duration, start time.Time) {
	total := int64(float64(len(members)) * perSec * duration.Seconds())
	if total == 0 {
		return
	}
	gap := duration / time.Duration(total)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for j := int64(0); j < total; {
		n := j
		for ; j < total && !time.Now().Before(start.Add(time.Duration(j)*gap)); j++ {
			_ = members[j%int64(len(members))].like() // a member that cannot write is counted as disconnected
		}
		l.mu.Lock()
		l.sent += j - n
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// likesSeen returns how many members see the total want, and the least and greatest totals
// seen.
func likesSeen(members []*rawClient, want int64) (exact int, least, most int64) {
	least = -1
	for _, m := range members {
		v := m.likes.Load()
		if v == want {
			exact++
		}
		if least < 0 || v < least {
			least = v
		}
		most = max(most, v)
	}
	return exact, max(least, 0), most
}
