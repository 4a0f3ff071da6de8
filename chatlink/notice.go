package chatlink

import (
	"cmp"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// App-wide notices (docs/api.md, "SendToAllRooms"): the server API publishes a notice once, on
// rc.nodes.control, and each node writes it to the members of the app's rooms it holds, each
// room at its own moment within the notice's spread rather than all at once. A room's moment is
// a hash of the notice's id and the room's name, so it is the same on every node: a room's
// members on different nodes get the notice together (to within the nodes' receipt of it),
// and a node's rooms are spread evenly. The rooms are those the node holds when the notice
// arrives; a room's members are those present at its moment. One goroutine, noticeLoop, keeps
// every notice being spread.

// maxNoticeSpread bounds a notice's spread, whatever the request says (the API allows a minute).
const maxNoticeSpread = 10 * time.Minute

// maxPendingNotices bounds the notices a node spreads at a time: past it a notice is written to
// all its rooms at once (and logged), rather than queued without end.
const maxPendingNotices = 64

// noticeRoom is one room of a notice's plan: when it is due, after the notice arrived.
type noticeRoom struct {
	at   time.Duration
	room string
}

// noticePlan is a notice being spread over a node's rooms of its app.
type noticePlan struct {
	app     string
	message *clientpb.Message
	start   time.Time
	rooms   []noticeRoom // by at
	next    int          // rooms[next:] are still due
}

// noticeSpreads hands notices to noticeLoop.
type noticeSpreads struct {
	n  *Node
	in chan *noticePlan
}

func newNoticeSpreads(n *Node) *noticeSpreads {
	return &noticeSpreads{n: n, in: make(chan *noticePlan, maxPendingNotices)}
}

// take plans an OP_NOTICE over the node's rooms of its app and hands it to noticeLoop, or, with
// no spread or too many notices pending, writes it to them at once.
func (s *noticeSpreads) take(req *buspb.NodeControl) {
	if req.Message == nil || req.App == "" {
		return
	}
	spread := min(time.Duration(req.SpreadMs)*time.Millisecond, maxNoticeSpread)
	rooms := s.n.rooms.ofApp(req.App)
	if len(rooms) == 0 {
		return
	}
	p := &noticePlan{app: req.App, message: req.Message, start: time.Now(), rooms: make([]noticeRoom, len(rooms))}
	for i, room := range rooms {
		p.rooms[i] = noticeRoom{at: noticeOffset(req.Message.Id, room, spread), room: room}
	}
	slices.SortFunc(p.rooms, func(a, b noticeRoom) int { return cmp.Compare(a.at, b.at) })
	if spread > 0 {
		select {
		case s.in <- p:
			return
		default:
			s.n.log.Warn("too many notices being spread: this one goes to every room at once", "app", req.App, "id", req.Message.Id, "rooms", len(rooms))
		}
	}
	p.due(math.MaxInt64, s.n)
}

// noticeOffset is a room's moment within a notice's spread: the same on every node.
func noticeOffset(id, room string, spread time.Duration) time.Duration {
	if spread <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(room))
	return time.Duration(h.Sum64() % uint64(spread))
}

// due writes the notice to the rooms due by elapsed since it arrived and says when the next one
// is due (false: none is left).
func (p *noticePlan) due(elapsed time.Duration, n *Node) (time.Duration, bool) {
	for ; p.next < len(p.rooms) && p.rooms[p.next].at <= elapsed; p.next++ {
		n.writeNotice(p.app, p.rooms[p.next].room, p.message)
	}
	if p.next == len(p.rooms) {
		return 0, false
	}
	return p.rooms[p.next].at, true
}

// noticeLoop writes the notices handed to it, each room when it is due, until the node stops.
func (n *Node) noticeLoop() {
	var plans []*noticePlan
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wake := time.Duration(-1) // until the next room is due; negative: none is
		now := time.Now()
		plans = slices.DeleteFunc(plans, func(p *noticePlan) bool {
			at, left := p.due(now.Sub(p.start), n)
			if left {
				if d := p.start.Add(at).Sub(now); wake < 0 || d < wake {
					wake = d
				}
			}
			return !left
		})
		var tick <-chan time.Time
		if wake >= 0 {
			timer.Reset(wake)
			tick = timer.C
		}
		select {
		case p := <-n.notices.in:
			plans = append(plans, p)
		case <-tick:
		case <-n.ctx.Done():
			return
		}
	}
}

// writeNotice writes m to the members of room whose LoginAck is written, with m.room set to the
// room; the frame is encoded once for them.
func (n *Node) writeNotice(app, room string, m *clientpb.Message) {
	r := n.rooms.lookup(app, room)
	if r == nil {
		return // its members left since the notice arrived
	}
	m = proto.CloneOf(m)
	m.Room = room
	written := r.writeAcked(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: []*clientpb.Message{m}}}}, false, "notice")
	n.m.deliveries[lane(m)].Add(float64(written))
}

// ofApp returns the names of the rooms of app with members on this node.
func (t *roomTable) ofApp(app string) []string {
	prefix := app + "/"
	var out []string
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for key := range sh.rooms {
			if room, ok := strings.CutPrefix(key, prefix); ok {
				out = append(out, room)
			}
		}
		sh.mu.Unlock()
	}
	return out
}
