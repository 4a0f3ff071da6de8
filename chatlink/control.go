package chatlink

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
	"roomcast/tag"
)

// Control: what the services and the server API ask of a node's connections. A request for this
// node arrives on rc.node.<node> (request/reply: kick, deliver, member lists, resync, and the
// requests by tag expression: kick, list and count a room's members whose tags satisfy one); a
// request for every node arrives on rc.nodes.control (bans, room closes, resync after a service
// restart, app-wide notices).

// tombstoneTTL is how long a node remembers a ban or a room close, to refuse logins that passed
// the room service's check just before it learned of the change. It must outlast a join
// request (RequestTimeout) plus the time the room service instances take to see a KV change.
const tombstoneTTL = 30 * time.Second

// maxMemberPage bounds one member list answer.
const maxMemberPage = 1000

// maxTagCounts bounds the distinct tags one OP_COUNT_TAGS answer counts: a prefix that more
// tags start with is answered with more set and no counts, not with a reply too big for the bus.
const maxTagCounts = 1000

// controlState is a node's memory of recent bans and room closes.
type controlState struct {
	mu         sync.Mutex           // guards the fields below
	bans       map[string]tombstone // by app/room/uid
	closed     map[string]tombstone // by app/room
	subscribed []*nats.Subscription
}

type tombstone struct {
	until  time.Time
	reason string
}

// subscribeControl subscribes to the control subjects, before the node's first session report
// makes the services ask for a snapshot on them. The node unsubscribes when it stops.
func (n *Node) subscribeControl() error {
	for _, subject := range []string{bus.NodeSubject(n.cfg.Node), bus.SubjectNodesControl} {
		sub, err := n.cfg.Bus.Subscribe(subject, n.onControl)
		if err != nil {
			return fmt.Errorf("chatlink: subscribe %s: %w", subject, err)
		}
		n.control.mu.Lock()
		n.control.subscribed = append(n.control.subscribed, sub)
		n.control.mu.Unlock()
	}
	if err := n.cfg.Bus.Flush(); err != nil {
		return fmt.Errorf("chatlink: subscribe control: %w", err)
	}
	return nil
}

// unsubscribe ends the control subscriptions.
func (s *controlState) unsubscribe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subscribed {
		_ = sub.Unsubscribe()
	}
	s.subscribed = nil
}

func (n *Node) onControl(msg *nats.Msg) {
	var req buspb.NodeControl
	if err := proto.Unmarshal(msg.Data, &req); err != nil {
		n.log.Warn("dropping control request that does not parse", "subject", msg.Subject)
		bus.Respond(n.log, msg, &buspb.NodeControlReply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "request does not parse"})
		return
	}
	var rep buspb.NodeControlReply
	var e *tag.Expr // req.TagExpr compiled; nil when there is none
	if req.TagExpr != "" {
		var err error
		if e, err = n.exprs.Get(req.TagExpr); err != nil {
			rep.Code, rep.Message = uint32(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR), err.Error()
			bus.Respond(n.log, msg, &rep)
			return
		}
	}
	switch req.Op {
	case buspb.NodeControl_OP_KICK:
		rep.Affected = n.kick(&req)
	case buspb.NodeControl_OP_DELIVER:
		rep.Affected = n.deliverTo(&req)
	case buspb.NodeControl_OP_NOTICE:
		n.notices.take(&req) // notice.go
	case buspb.NodeControl_OP_MEMBERS:
		rep.Members, rep.More = n.listMembers(&req, e)
	case buspb.NodeControl_OP_KICK_EXPR:
		if e == nil || req.Room == "" {
			rep.Code, rep.Message = uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), "a kick by tag expression needs room and tag_expr"
			break
		}
		rep.Affected = n.kickByTags(&req, e)
	case buspb.NodeControl_OP_COUNT_TAGS:
		n.countTags(&req, &rep)
	case buspb.NodeControl_OP_BAN:
		if req.Lift {
			n.control.forget(n.control.bans, req.App+"/"+req.Room+"/"+req.Uid)
			break
		}
		n.control.remember(&n.control.bans, req.App+"/"+req.Room+"/"+req.Uid, req.Reason, n.now())
		req.CloseCode = uint32(clientpb.CloseCode_CLOSE_CODE_BANNED)
		rep.Affected = n.kick(&req)
	case buspb.NodeControl_OP_CLOSE_ROOM:
		if req.Lift {
			n.control.forget(n.control.closed, req.App+"/"+req.Room)
			break
		}
		n.control.remember(&n.control.closed, req.App+"/"+req.Room, req.Reason, n.now())
		req.Uid, req.Sessions = "", nil
		req.CloseCode = uint32(clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED)
		rep.Affected = n.kick(&req)
	case buspb.NodeControl_OP_RESYNC:
		n.publishSnapshot()
	case buspb.NodeControl_OP_SET_TAGS:
		if err := tag.Validate(req.Tags); err != nil {
			rep.Code, rep.Message = uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), err.Error()
			break
		}
		for _, c := range n.targets(&req) {
			if c.setTags(req.Tags) {
				rep.Affected++
			}
		}
	default:
		rep.Code, rep.Message = uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), fmt.Sprintf("unknown op %v", req.Op)
	}
	bus.Respond(n.log, msg, &rep)
}

// targets returns the live connections a control request names: the sessions listed (of uid,
// when set), or, with none listed, the room's members (of uid, when set), or every session of uid in the app.
func (n *Node) targets(req *buspb.NodeControl) []*conn {
	var out []*conn
	match := func(c *conn) {
		switch {
		case c.getState() != stateLive || c.app != req.App:
		case len(req.Sessions) > 0:
			if slices.Contains(req.Sessions, c.session) && (req.Uid == "" || c.uid == req.Uid) {
				out = append(out, c)
			}
		case (req.Room == "" || c.room == req.Room) && (req.Uid == "" || c.uid == req.Uid):
			out = append(out, c)
		}
	}
	if req.Room != "" {
		for _, c := range n.rooms.members(req.App, req.Room) {
			match(c)
		}
		return out
	}
	n.conns.each(match)
	return out
}

func (n *Node) kick(req *buspb.NodeControl) int64 {
	if req.Room == "" && req.Uid == "" && len(req.Sessions) == 0 {
		return 0 // never "everyone in the app"
	}
	code := clientpb.CloseCode(req.CloseCode)
	if code == clientpb.CloseCode_CLOSE_CODE_UNSPECIFIED {
		code = clientpb.CloseCode_CLOSE_CODE_KICKED
	}
	reason := req.Reason
	if reason == "" {
		reason = "removed by the app server"
	}
	var kicked int64
	for _, c := range n.targets(req) {
		if !c.closing.Load() {
			c.close(code, reason)
			kicked++
		}
	}
	return kicked
}

// deliverTo pushes req.Message to the sessions listed; the frame is encoded once.
func (n *Node) deliverTo(req *buspb.NodeControl) int64 {
	if req.Message == nil || len(req.Sessions) == 0 {
		return 0
	}
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: []*clientpb.Message{req.Message}}}})
	if err != nil {
		n.log.Error("encode push", "err", err)
		return 0
	}
	req.Room = "" // sessions may be in any room
	var delivered int64
	for _, c := range n.targets(req) {
		c.t.write(b)
		delivered++
	}
	n.m.deliveries[lane(req.Message)].Add(float64(delivered))
	return delivered
}

// listMembers answers a page of a room's local members, in session id order: those with
// req.Tag, when set, and whose tags satisfy e, when not nil.
func (n *Node) listMembers(req *buspb.NodeControl, e *tag.Expr) ([]*buspb.Member, bool) {
	limit := int(req.Limit)
	if limit <= 0 || limit > maxMemberPage {
		limit = maxMemberPage
	}
	var conns []*conn
	for _, c := range n.rooms.members(req.App, req.Room) {
		if c.getState() == stateLive && c.session > req.After && (req.Uid == "" || c.uid == req.Uid) &&
			(req.Tag == "" || slices.Contains(c.tagList(), req.Tag)) && satisfies(e, c) {
			conns = append(conns, c)
		}
	}
	slices.SortFunc(conns, func(a, b *conn) int { return strings.Compare(a.session, b.session) })
	more := len(conns) > limit
	if more {
		conns = conns[:limit]
	}
	out := make([]*buspb.Member, len(conns))
	for i, c := range conns {
		out[i] = &buspb.Member{Uid: c.uid, SessionId: c.session, Node: n.cfg.Node, Device: c.device, Tags: c.tagList(), LoginTimeMs: c.loginMS}
	}
	return out, more
}

// satisfies reports whether c's tags satisfy e; a nil e is satisfied by every member, a member
// that has closed (and lost its tags) by none.
func satisfies(e *tag.Expr, c *conn) bool {
	if e == nil {
		return true
	}
	set := c.tags.Load()
	return set != nil && e.Eval(set, c.uid)
}

// kickByTags closes every live session in req.Room whose member's tags satisfy e.
func (n *Node) kickByTags(req *buspb.NodeControl, e *tag.Expr) int64 {
	reason := req.Reason
	if reason == "" {
		reason = "removed by the app server"
	}
	var kicked int64
	for _, c := range n.rooms.members(req.App, req.Room) {
		if c.getState() == stateLive && !c.closing.Load() && satisfies(e, c) {
			c.close(clientpb.CloseCode_CLOSE_CODE_KICKED, reason)
			kicked++
		}
	}
	return kicked
}

// countTags answers how many of req.Room's local members there are (affected), how many satisfy
// each of req.TagExprs and how many carry each tag starting with req.TagPrefix. It works on the
// room's tag sets: each expression is evaluated once per distinct set present (once per member
// only when it reads uid), so a count costs the room's distinct tag sets, not its members.
func (n *Node) countTags(req *buspb.NodeControl, rep *buspb.NodeControlReply) {
	exprs := make([]*tag.Expr, len(req.TagExprs))
	for i, src := range req.TagExprs {
		e, err := n.exprs.Get(src)
		if err != nil {
			rep.Code, rep.Message = uint32(clientpb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR), fmt.Sprintf("tag_exprs[%d]: %v", i, err)
			return
		}
		exprs[i] = e
	}
	sets := n.rooms.tagSets(req.App, req.Room)
	rep.ExprCounts = make([]int64, len(exprs))
	var members []*conn // fetched once, for the expressions that read uid
	for i, e := range exprs {
		if !e.UsesUID() {
			for set, k := range sets {
				if e.Eval(set, "") {
					rep.ExprCounts[i] += int64(k)
				}
			}
			continue
		}
		if members == nil {
			members = n.rooms.members(req.App, req.Room)
		}
		for _, c := range members {
			if satisfies(e, c) {
				rep.ExprCounts[i]++
			}
		}
	}
	for _, k := range sets {
		rep.Affected += int64(k)
	}
	if req.TagPrefix == "" {
		return
	}
	rep.TagCounts = make(map[string]int64)
	for set, k := range sets {
		for _, t := range set.Tags {
			if strings.HasPrefix(t, req.TagPrefix) {
				rep.TagCounts[t] += int64(k)
			}
		}
		if len(rep.TagCounts) > maxTagCounts {
			rep.TagCounts, rep.More = nil, true
			return
		}
	}
}

// tagSets returns how many of a room's local members hold each tag set (a copy).
func (t *roomTable) tagSets(app, room string) map[*tag.Set]int {
	r := t.lookup(app, room)
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return maps.Clone(r.sets)
}

func (s *controlState) remember(m *map[string]tombstone, key, reason string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *m == nil {
		*m = make(map[string]tombstone)
	}
	(*m)[key] = tombstone{until: now.Add(tombstoneTTL), reason: reason}
}

func (s *controlState) forget(m map[string]tombstone, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(m, key)
}

func (s *controlState) expireTombstones(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range []map[string]tombstone{s.bans, s.closed} {
		for k, t := range m {
			if now.After(t.until) {
				delete(m, k)
			}
		}
	}
}

// refusedLate closes c, which has just gone live, if its room was closed or its user banned
// while its login was on the way, and reports whether it did. A ban first records its tombstone
// and then kicks the room's members; a login first joins the room and then checks here: so either
// the kick finds the connection or this check finds the tombstone.
func (n *Node) refusedLate(c *conn) bool {
	s := &n.control
	now := n.now()
	s.mu.Lock()
	code, reason := clientpb.CloseCode_CLOSE_CODE_UNSPECIFIED, ""
	if t, ok := s.closed[c.app+"/"+c.room]; ok && now.Before(t.until) {
		code, reason = clientpb.CloseCode_CLOSE_CODE_ROOM_CLOSED, t.reason
	} else if t, ok := s.bans[c.app+"/"+c.room+"/"+c.uid]; ok && now.Before(t.until) {
		code, reason = clientpb.CloseCode_CLOSE_CODE_BANNED, t.reason
	}
	s.mu.Unlock()
	if code == clientpb.CloseCode_CLOSE_CODE_UNSPECIFIED {
		return false
	}
	if reason == "" {
		reason = "refused"
	}
	n.countLogin(c, time.Time{}, "refused", code, reason)
	c.close(code, reason)
	return true
}

// refusalCode is the close code for a login the room service refused.
func refusalCode(rep *buspb.Reply) clientpb.CloseCode {
	if rep.CloseCode != 0 {
		return clientpb.CloseCode(rep.CloseCode)
	}
	return clientpb.CloseCode_CLOSE_CODE_KICKED
}

// Kill stops the node as a crash would, for tests: its NATS connection and listeners close and
// its clients' connections drop, with no Kick, no logout events and no last report, so the
// services only learn of it when its lease runs out. Shutdown afterwards does nothing.
func (n *Node) Kill() {
	n.shutdownOnce.Do(func() {
		n.draining.Store(true)
		n.cfg.Bus.Close()
		n.closeListeners()
		n.conns.each(func(c *conn) { c.t.forceClose() })
		n.cancel()
		n.control.unsubscribe()
		if n.poll != nil {
			n.poll.Stop()
		}
		n.wg.Wait()
		n.log.Info("chatlink killed")
	})
}
