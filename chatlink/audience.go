package chatlink

import (
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
// sets: a message with a tag expression goes only to members whose tags satisfy it. The
// expressions are compiled once (n.exprs) and evaluated once per distinct tag set in the room,
// or once per member when one of them reads uid.
type audiences struct {
	exprs     []*tag.Expr         // by message; nil when no message is targeted
	perMember bool                // an expression reads uid
	bySet     map[*tag.Set]string // the audience bitset per tag set, as far as worked out
}

// newAudiences compiles the tag expressions of msgs.
func (n *Node) newAudiences(msgs []queued) audiences {
	var a audiences
	for i, q := range msgs {
		if q.m.TagExpr == "" {
			continue
		}
		if a.exprs == nil {
			a.exprs = make([]*tag.Expr, len(msgs))
			a.bySet = make(map[*tag.Set]string)
		}
		a.exprs[i] = n.expr(q.m.TagExpr)
		a.perMember = a.perMember || a.exprs[i].UsesUID()
	}
	return a
}

// targeted reports whether any message has a tag expression; when none has, every member
// sees every message and of need not be asked.
func (a *audiences) targeted() bool { return a.exprs != nil }

// of returns the bitset of the messages member c may see (see audience).
func (a *audiences) of(c *conn) string {
	set := c.tags.Load()
	bits, ok := a.bySet[set]
	if !ok || a.perMember {
		bits = audience(a.exprs, set, c.uid)
		a.bySet[set] = bits
	}
	return bits
}

// audience returns the bitset of the messages a member with tag set set and uid may see: bit i
// is set when message i has no tag expression or the member satisfies it.
func audience(exprs []*tag.Expr, set *tag.Set, uid string) string {
	bits := make([]byte, (len(exprs)+7)/8)
	for i, e := range exprs {
		if e == nil || e.Eval(set, uid) {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return string(bits)
}
