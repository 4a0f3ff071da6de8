package room

import (
	"sync"
	"time"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// DefaultBulkPerSecond is the bulk messages a room sends on per second when neither its settings
// (RoomSettings.bulk_per_second) nor the service (Config.BulkPerSecond) say otherwise: ten times
// a member's default budget, so the edge still has a choice to make.
const DefaultBulkPerSecond = 200

// bulkCap thins each room's bulk lane before the bus: a room passes at most its rate of bulk
// messages a second to its nodes (bursts of up to one second's worth), and the rest are sampled
// out, counted and never published. Critical and normal messages are never capped here, nor
// bulk messages on their way to a CDN pusher, which samples its segments itself. The cap is per
// instance: with n instances sharing a room's senders, the room passes up to n times the rate.
type bulkCap struct {
	mu    sync.Mutex // guards rooms
	rooms map[roomKey]*tokens
}

// tokens is a room's token bucket: level tokens at time at, refilled at the room's rate.
type tokens struct {
	level float64
	at    time.Time
}

func newBulkCap() *bulkCap { return &bulkCap{rooms: make(map[roomKey]*tokens)} }

// keep decides which of a room's bulk messages go on, at rate a second (rate <= 0: all of
// them); those that route sends to a CDN pusher are not counted here (the pusher samples
// its own). It returns msgs without the sampled out ones (in place, order kept) and how many
// those were.
func (c *bulkCap) keep(k roomKey, rate int, route *buspb.CdnRoute, now time.Time, msgs []*clientpb.Message, senders []string) ([]*clientpb.Message, []string, int) {
	if rate <= 0 {
		return msgs, senders, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.rooms[k]
	if t == nil {
		t = &tokens{level: float64(rate), at: now}
		c.rooms[k] = t
	}
	t.level = min(float64(rate), t.level+now.Sub(t.at).Seconds()*float64(rate))
	t.at = now
	n := 0
	for i, m := range msgs {
		if m.Lane == clientpb.Lane_LANE_BULK && !toPusher(route, m) {
			if t.level < 1 {
				continue
			}
			t.level--
		}
		msgs[n], senders[n] = m, senders[i]
		n++
	}
	return msgs[:n], senders[:n], len(msgs) - n
}

// expire forgets the rooms that sent no bulk message for a second: their buckets are full again,
// as a new one starts.
func (c *bulkCap) expire(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.rooms {
		if now.Sub(t.at) > time.Second {
			delete(c.rooms, k)
		}
	}
}

// bulkRate is the room's bulk cap a second (RoomSettings.bulk_per_second, else the service's);
// 0 means none.
func (s *Service) bulkRate(st *roompb.RoomSettings) int {
	r := int(st.GetBulkPerSecond())
	if r == 0 {
		r = s.cfg.BulkPerSecond
	}
	return max(r, 0)
}
