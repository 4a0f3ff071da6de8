package chatlink

import (
	"context"
	"time"

	"roomcast/internal/ids"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// recoverTimeout bounds a read of a room's history for recoveries, and a login's wait for it
// (historyread.go). A dead node's members all recover on the node they come back to in the
// same second: before their reads were shared, 2,000 of them in TestKillChatLink under CI's
// load had hundreds of reads time out together at 2 s (Error 503, their missed messages never
// sent). 8 s is within the 10 s the SDKs give a login.
const recoverTimeout = 8 * time.Second

// maxFutureSince is how far ahead of the node's clock a recover_since may be: ids are stamped
// by the room service's clock, which may run a little ahead of this node's.
const maxFutureSince = time.Minute

// historyAsk is what a login asked of the room's history: the messages after since (with the
// client's last room_seq, sinceSeq), or else the last n.
type historyAsk struct {
	since    string
	sinceSeq uint64
	last     int
	// The room's retention when it keeps less than the stream (RoomSettings.history_max_*):
	// the newest keep messages (0: all), none older than age (0: any age).
	keep int
	age  time.Duration
}

func askOf(l *clientpb.Login) historyAsk {
	return historyAsk{since: l.RecoverSince, sinceSeq: l.RecoverSinceRoomSeq, last: min(int(l.History), historystore.PerRoom)}
}

func (a historyAsk) wanted() bool { return a.since != "" || a.last > 0 }

// checkSince reports whether recover_since is a message id from the past (or at most
// maxFutureSince ahead of now).
func checkSince(since string, now time.Time) bool {
	at, ok := ids.MessageTime(since)
	return ok && !at.After(now.Add(maxFutureSince))
}

// recoverHistory answers a login's history request, after its LoginAck: the room's kept
// messages it asked for that the member's tags allow, in Push frames marked history, the last
// with a Recovery that says whether that was all. If the history cannot be read it answers with
// an Error (503) instead, so that the client does not wait for it.
func (n *Node) recoverHistory(c *conn, ask historyAsk) {
	ctx, cancel := context.WithTimeout(n.ctx, recoverTimeout)
	defer cancel()
	kept, err := n.histReads.read(ctx, historyKey{app: c.app, room: c.room, keep: ask.keep, age: ask.age})
	if err != nil {
		n.log.Warn("history not read", "session", c.session, "err", err)
		c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: "the room's history could not be read",
		}}})
		return
	}
	set := c.tags.Load()
	if set == nil {
		return // closed meanwhile
	}
	allow := func(m *clientpb.Message) bool {
		return !kept.recalled[m.Id] && (m.TagExpr == "" || n.expr(m.TagExpr).Eval(set, c.uid))
	}
	out, rec := selectHistory(kept.msgs, ask, allow)
	for _, b := range pushFrames(out, pushMeta{history: true, recovery: rec}) {
		c.write(b)
	}
}

// newHistoryReads returns the node's shared reads of its rooms' history for recoveries
// (historyread.go). A read may take recoverTimeout.
func (n *Node) newHistoryReads() *historyReads {
	return &historyReads{
		fetch: func(k historyKey) (roomHistory, error) {
			ctx, cancel := context.WithTimeout(n.ctx, recoverTimeout)
			defer cancel()
			return n.history(ctx, k.app, k.room, historyAsk{keep: k.keep, age: k.age})
		},
		spawn: n.goAsync,
		served: func(askers int) {
			n.m.recoveryReads.Inc()
			n.m.recoveryAskers.Add(float64(askers))
		},
	}
}

// selectHistory picks, from a room's kept messages (oldest first), those a history request
// gets that allow lets the member see, and says whether that was everything.
//
// After since, with the client's last room_seq (sinceSeq) within the kept numbers, the numbers
// decide: the messages numbered above sinceSeq are sent (and unnumbered ones after since), and
// the history is complete when none of the numbers from sinceSeq to the highest kept is missing
// from what is kept. Ids cannot decide here: an id is stamped when its send is accepted and the
// number when its batch window leaves (room/batcher.go), so a message accepted earlier on one
// room-service instance can be numbered and delivered after one accepted later on another, and
// it would be left out of a recovery since the later one. Messages kept but not allowed are not
// missing: they were never for this member. Without sinceSeq (or with one from before the
// room's counter started again) the ids decide: complete when the history reaches back to
// since or still holds the room's first message; otherwise missing is not known and is 0.
func selectHistory(kept []*clientpb.Message, ask historyAsk, allow func(*clientpb.Message) bool) ([]*clientpb.Message, *clientpb.Recovery) {
	var top, above uint64 // the highest kept room_seq; how many kept are numbered above sinceSeq
	for _, m := range kept {
		top = max(top, m.RoomSeq)
		if m.RoomSeq > ask.sinceSeq {
			above++
		}
	}
	bySeq := ask.since != "" && ask.sinceSeq > 0 && ask.sinceSeq <= top
	after := func(m *clientpb.Message) bool {
		switch {
		case ask.since == "":
			return true
		case bySeq && m.RoomSeq > 0:
			return m.RoomSeq > ask.sinceSeq
		}
		return m.Id > ask.since
	}
	var out []*clientpb.Message
	for _, m := range kept {
		if after(m) && allow(m) {
			out = append(out, m)
		}
	}
	if ask.since == "" {
		if len(out) > ask.last {
			out = out[len(out)-ask.last:]
		}
		return out, &clientpb.Recovery{Recovered: true}
	}
	if bySeq {
		var missing uint64
		if want := top - ask.sinceSeq; want > above {
			missing = want - above
		}
		return out, &clientpb.Recovery{Recovered: missing == 0, Missing: missing}
	}
	complete := len(kept) == 0 || kept[0].Id <= ask.since || kept[0].RoomSeq == 1
	return out, &clientpb.Recovery{Recovered: complete}
}

// history reads the messages kept for a room within the retention ask carries, oldest first,
// with those recalled marked (never sent; a recall counts as neither sent nor missing).
func (n *Node) history(ctx context.Context, app, room string, ask historyAsk) (roomHistory, error) {
	var since time.Time
	if ask.age > 0 {
		since = n.now().Add(-ask.age)
	}
	kept, skipped, err := historystore.Read(ctx, n.js, app, room, historystore.Range{Since: since, Keep: ask.keep, Recalled: true})
	if skipped > 0 {
		n.log.Warn("kept messages that do not decode left out of a room's history", "app", app, "room", room, "skipped", skipped)
	}
	if err != nil {
		return roomHistory{}, err
	}
	h := roomHistory{msgs: make([]*clientpb.Message, len(kept))}
	for i, k := range kept {
		h.msgs[i] = k.Msg
		if k.Recalled {
			if h.recalled == nil {
				h.recalled = make(map[string]bool)
			}
			h.recalled[k.Msg.Id] = true
		}
	}
	return h, nil
}
