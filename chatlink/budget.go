package chatlink

import (
	"time"

	pb "roomcast/proto/roomcastpb"
)

// tokenCap is how many messages of a budget may go out at once: one tick's worth (at least
// 100 ms worth, and at least one), so a burst is spread over the second instead of taking the
// whole second's budget at its start.
func tokenCap(budget float64, tick time.Duration) float64 {
	if budget < 0 {
		return 0
	}
	return max(1, budget*max(tick, 100*time.Millisecond).Seconds())
}

// selectLocked applies the room's budgets and the node's flow control to a tick's messages and
// returns those to deliver, in order. Critical messages are never dropped. Over budget, normal
// messages are kept before bulk ones, and the kept ones are spread evenly over the tick rather
// than being its first few. What it leaves out, by lane, is in f.dropped until the next call.
// Caller holds f.mu.
func (f *roomFanout) selectLocked(msgs []queued, now time.Time, strength float64) []queued {
	n := f.r.t.n
	s := f.settings
	elapsed := now.Sub(f.refilledAt).Seconds()
	f.refilledAt = now
	var count [4]int
	for _, q := range msgs {
		count[lane(q.m)]++
	}

	// Budgets: how many of each lane may go.
	allowed := count
	if s.normalBudget >= 0 {
		f.normalTokens = min(tokenCap(s.normalBudget, s.tick), f.normalTokens+s.normalBudget*elapsed)
		k := int(f.normalTokens)
		allowed[pb.Lane_LANE_NORMAL] = min(count[pb.Lane_LANE_NORMAL], k)
		allowed[pb.Lane_LANE_BULK] = min(count[pb.Lane_LANE_BULK], k-allowed[pb.Lane_LANE_NORMAL])
		f.normalTokens -= float64(allowed[pb.Lane_LANE_NORMAL] + allowed[pb.Lane_LANE_BULK])
	}
	if s.criticalBudget >= 0 {
		f.criticalTokens = min(tokenCap(s.criticalBudget, s.tick), f.criticalTokens+s.criticalBudget*elapsed)
		if over := float64(count[pb.Lane_LANE_CRITICAL]) - f.criticalTokens; over > 0 {
			n.m.criticalOverBudget.Add(over)
		}
		f.criticalTokens = max(0, f.criticalTokens-float64(count[pb.Lane_LANE_CRITICAL]))
	}

	keepNormal, keepBulk := keepFractions(strength)
	keepFrac := [4]float64{1, 1, keepNormal, keepBulk}
	kept := msgs[:0] // filtering in place: msgs is not used after
	var seen [4]int
	var dropped [4][2]int // by lane: budget, flow control
	for _, q := range msgs {
		l := lane(q.m)
		i := seen[l]
		seen[l]++
		// Budget: keep message i of the lane's count[l] when it crosses the next multiple of
		// count/allowed: an even spread.
		if allowed[l] < count[l] && (i+1)*allowed[l]/count[l] == i*allowed[l]/count[l] {
			dropped[l][0]++
			continue
		}
		if l != pb.Lane_LANE_CRITICAL {
			f.fcCarry[l] += keepFrac[l]
			if f.fcCarry[l] < 1 {
				dropped[l][1]++
				continue
			}
			f.fcCarry[l]--
		}
		kept = append(kept, q)
	}
	for l := range dropped {
		f.dropped[l] = dropped[l][0] + dropped[l][1]
		if d := dropped[l][0]; d > 0 {
			n.m.drops[l][dropBudget].Add(float64(d))
		}
		if d := dropped[l][1]; d > 0 {
			n.m.drops[l][dropFlowControl].Add(float64(d))
		}
	}
	return kept
}
