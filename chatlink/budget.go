package chatlink

import (
	"time"

	"roomcast/proto/clientpb"
	"roomcast/tag"
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
// returns those to deliver, in order. Critical messages are never dropped.
//
// The normal budget applies to what each member would receive: per tag set in the room (an
// audience), to the tick's normal and bulk messages that reach it (untargeted ones and those
// whose tag expression it satisfies), each audience with its own tokens. Over budget, normal
// messages are kept before bulk ones, and the kept ones are spread evenly over the tick rather
// than being its first few. A message some audiences keep and others leave out goes to the log
// with the left-out audiences in its skip; one no audience keeps leaves the log. Messages whose
// expression reads uid reach single members and are not budgeted.
//
// What it leaves out is in f.dropped (by lane: what every member would have received) and
// f.droppedFor (by audience: the rest) until the next call. Caller holds f.mu.
func (f *roomFanout) selectLocked(msgs []queued, now time.Time, strength float64) []queued {
	n := f.r.t.n
	s := f.settings
	elapsed := now.Sub(f.refilledAt).Seconds()
	f.refilledAt = now
	var count [4]int
	for _, q := range msgs {
		count[lane(q.m)]++
	}
	clear(f.droppedFor)
	var dropped [4][2]int // by lane: budget, flow control
	if s.normalBudget >= 0 && count[clientpb.Lane_LANE_NORMAL]+count[clientpb.Lane_LANE_BULK] > 0 {
		msgs = f.budgetLocked(msgs, elapsed, &dropped)
	}
	if s.criticalBudget >= 0 {
		f.criticalTokens = min(tokenCap(s.criticalBudget, s.tick), f.criticalTokens+s.criticalBudget*elapsed)
		if over := float64(count[clientpb.Lane_LANE_CRITICAL]) - f.criticalTokens; over > 0 {
			n.m.criticalOverBudget.Add(over)
		}
		f.criticalTokens = max(0, f.criticalTokens-float64(count[clientpb.Lane_LANE_CRITICAL]))
	}

	keepNormal, keepBulk := keepFractions(strength)
	keepFrac := [4]float64{1, 1, keepNormal, keepBulk}
	kept := msgs[:0] // filtering in place: msgs is not used after
	for _, q := range msgs {
		l := lane(q.m)
		if l != clientpb.Lane_LANE_CRITICAL {
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

// budgetLocked thins msgs to the normal budget of each audience in the room (see selectLocked)
// and returns what some audience keeps, in order. It adds what it leaves out for every member
// to dropped[lane][0] and the rest to f.droppedFor; a message left out for some audiences
// counts once in the metrics. Caller holds f.mu.
func (f *roomFanout) budgetLocked(msgs []queued, elapsed float64, dropped *[4][2]int) []queued {
	n := f.r.t.n
	s := f.settings
	exprs := make([]*tag.Expr, len(msgs)) // nil: reaches every audience
	budgeted := make([]bool, len(msgs))
	for i, q := range msgs {
		if lane(q.m) == clientpb.Lane_LANE_CRITICAL {
			continue
		}
		budgeted[i] = true
		if q.m.TagExpr != "" {
			exprs[i] = n.expr(q.m.TagExpr)
			budgeted[i] = !exprs[i].UsesUID()
		}
	}

	f.r.mu.RLock()
	sets := make([]*tag.Set, 0, len(f.r.sets))
	for set := range f.r.sets {
		sets = append(sets, set)
	}
	for set := range f.tokens {
		if _, ok := f.r.sets[set]; !ok {
			delete(f.tokens, set) // the audience has left
		}
	}
	f.r.mu.RUnlock()
	if f.tokens == nil {
		f.tokens = make(map[*tag.Set]float64)
	}

	sees := make([]bool, len(msgs))
	viewers := make([]int, len(msgs)) // audiences each message reaches
	skips := make([][]*tag.Set, len(msgs))
	for _, set := range sets {
		var count [4]int
		for i, q := range msgs {
			sees[i] = budgeted[i] && (exprs[i] == nil || exprs[i].Eval(set, ""))
			if sees[i] {
				count[lane(q.m)]++
				viewers[i]++
			}
		}
		tokens, ok := f.tokens[set]
		if !ok {
			tokens = tokenCap(s.normalBudget, s.tick)
		}
		tokens = min(tokenCap(s.normalBudget, s.tick), tokens+s.normalBudget*elapsed)
		k := int(tokens)
		var allowed [4]int
		allowed[clientpb.Lane_LANE_NORMAL] = min(count[clientpb.Lane_LANE_NORMAL], k)
		allowed[clientpb.Lane_LANE_BULK] = min(count[clientpb.Lane_LANE_BULK], k-allowed[clientpb.Lane_LANE_NORMAL])
		f.tokens[set] = tokens - float64(allowed[clientpb.Lane_LANE_NORMAL]+allowed[clientpb.Lane_LANE_BULK])
		var seen [4]int
		for i, q := range msgs {
			if !sees[i] {
				continue
			}
			l := lane(q.m)
			j := seen[l]
			seen[l]++
			// Keep message j of the lane's count[l] when it crosses the next multiple of
			// count/allowed: an even spread.
			if allowed[l] < count[l] && (j+1)*allowed[l]/count[l] == j*allowed[l]/count[l] {
				skips[i] = append(skips[i], set)
			}
		}
	}

	// A message every audience leaves out leaves the log; the members learn of it by the
	// room's count when it would have reached every one of them, else by their audience's.
	kept := msgs[:0] // filtering in place: msgs is not used after
	for i, q := range msgs {
		skip := skips[i]
		if len(skip) == 0 {
			kept = append(kept, q)
			continue
		}
		l := lane(q.m)
		if exprs[i] == nil && len(skip) == len(sets) {
			dropped[l][0]++ // counted in f.dropped by the caller
			continue
		}
		n.m.drops[l][dropBudget].Inc()
		if f.droppedFor == nil {
			f.droppedFor = make(map[*tag.Set][4]int)
		}
		for _, set := range skip {
			d := f.droppedFor[set]
			d[l]++
			f.droppedFor[set] = d
		}
		if len(skip) == viewers[i] {
			continue
		}
		q.skip = make(map[*tag.Set]struct{}, len(skip))
		for _, set := range skip {
			q.skip[set] = struct{}{}
		}
		kept = append(kept, q)
	}
	return kept
}
