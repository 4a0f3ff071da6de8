package chatlink

import (
	"encoding/binary"

	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// never is the expression a message gets when its tag expression does not compile: it reaches
// no one. The room service refuses such messages, so this only guards against a bad publisher.
var never, _ = tag.Compile("false")

// expr returns the compiled tag expression src.
func (n *Node) expr(src string) *tag.Expr {
	e, err := n.exprs.Get(src)
	if err != nil {
		n.log.Warn("room message with a bad tag expression reaches no one", "expr", src, "err", err)
		return never
	}
	return e
}

// audiences works out which of one write's messages each member may see, by the members' tag
// sets: a message with a tag expression goes only to members whose tags satisfy it, and a
// message the budgets left out for a tag set (queued.skip) goes to no member with that set. The
// expressions are compiled once (n.exprs) and evaluated once per distinct tag set in the room,
// or once per member when one of them reads uid.
type audiences struct {
	msgs       []queued
	exprs      []*tag.Expr              // by message; nil when no message is targeted or skipped
	perMember  bool                     // an expression reads uid
	bySet      map[*tag.Set]string      // the variant's audience key per tag set, as far as worked out
	thinnedFor map[*tag.Set]*pb.Thinned // left out by the budgets, by tag set (a marker's thinnedCounts.byAudience)
	thinned    map[string]*pb.Thinned   // the same, by audience key
}

// newAudiences compiles the tag expressions of msgs; thinnedFor is what the budgets left out
// for some tag sets only, which goes into those members' audience keys.
func (n *Node) newAudiences(msgs []queued, thinnedFor map[*tag.Set]*pb.Thinned) audiences {
	a := audiences{msgs: msgs, thinnedFor: thinnedFor}
	for i, q := range msgs {
		if q.m.TagExpr == "" && q.skip == nil {
			continue
		}
		if a.exprs == nil {
			a.exprs = make([]*tag.Expr, len(msgs))
		}
		if q.m.TagExpr != "" {
			a.exprs[i] = n.expr(q.m.TagExpr)
			a.perMember = a.perMember || a.exprs[i].UsesUID()
		}
	}
	if a.exprs == nil && thinnedFor != nil {
		a.exprs = make([]*tag.Expr, len(msgs))
	}
	if a.exprs != nil {
		a.bySet = make(map[*tag.Set]string)
	}
	return a
}

// targeted reports whether members may see different messages or counts; when not, every
// member sees every message and of need not be asked.
func (a *audiences) targeted() bool { return a.exprs != nil }

// of returns member c's audience key: the bitset of the messages it may see (see audience),
// followed by what the budgets left out for its tag set when that is not nothing.
func (a *audiences) of(c *conn) string {
	set := c.tags.Load()
	key, ok := a.bySet[set]
	if !ok || a.perMember {
		key = audience(a.exprs, a.msgs, set, c.uid)
		if t := a.thinnedFor[set]; t != nil {
			key = string(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32([]byte(key), t.Normal), t.Bulk))
			if a.thinned == nil {
				a.thinned = make(map[string]*pb.Thinned)
			}
			a.thinned[key] = t
		}
		a.bySet[set] = key
	}
	return key
}

// thinnedOf returns what the budgets left out for the members of audience key (nil for none).
func (a *audiences) thinnedOf(key string) *pb.Thinned { return a.thinned[key] }

// audience returns the bitset of the messages a member with tag set set and uid may see: bit i
// is set when message i has no tag expression or the member satisfies it, and the budgets did
// not leave it out for set.
func audience(exprs []*tag.Expr, msgs []queued, set *tag.Set, uid string) string {
	bits := make([]byte, (len(exprs)+7)/8)
	for i, e := range exprs {
		if _, skipped := msgs[i].skip[set]; skipped {
			continue
		}
		if e == nil || e.Eval(set, uid) {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return string(bits)
}
