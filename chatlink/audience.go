package chatlink

import (
	"encoding/binary"
	"sync"

	"roomcast/proto/clientpb"
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
// expressions are compiled once (n.exprs). A message whose expression names tags (tag.Expr.AnyOf:
// `"c:3" in tags || "g:17" in tags`) is found by the tags of each set, without evaluating it; the
// others are evaluated once per distinct tag set in the write, or once per member when one of
// them reads uid. A write to 600 members in 500 tag sets of 25 such messages does 1,000 map
// lookups instead of 12,500 evaluations.
type audiences struct {
	msgs       []queued
	exprs      []*tag.Expr                    // by message; nil when no message is targeted or skipped
	perMember  bool                           // an expression reads uid
	always     []byte                         // bits of the messages without an expression
	byTag      map[string][]byte              // bits of the messages whose expression names the tag (AnyOf)
	evaluated  []int                          // messages whose expression is evaluated per set (or member)
	skipped    []int                          // messages the budgets left out for some sets
	bySet      map[*tag.Set]string            // the variant's audience key per tag set, as far as worked out (bySetPool)
	keys       map[string]string              // the distinct audience keys, each made once per write
	thinnedFor map[*tag.Set]*clientpb.Thinned // left out by the budgets, by tag set (a marker's thinnedCounts.byAudience)
	thinned    map[string]*clientpb.Thinned   // the same, by audience key
	scratch    []byte                         // the key being built
}

// newAudiences compiles the tag expressions of msgs; thinnedFor is what the budgets left out
// for some tag sets only, which goes into those members' audience keys.
func (n *Node) newAudiences(msgs []queued, thinnedFor map[*tag.Set]*clientpb.Thinned) audiences {
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
	if a.exprs == nil {
		return a
	}
	// A phase write meets hundreds of tag sets: a map kept from earlier writes does not grow
	// (and allocate) its way up to them every time.
	a.bySet = bySetPool.Get().(map[*tag.Set]string)
	a.keys = make(map[string]string)
	size := (len(msgs) + 7) / 8
	a.always = make([]byte, size)
	a.scratch = make([]byte, size)
	for i, e := range a.exprs {
		if msgs[i].skip != nil {
			a.skipped = append(a.skipped, i)
		}
		if e == nil {
			a.always[i/8] |= 1 << (i % 8)
			continue
		}
		tags, ok := e.AnyOf()
		if !ok {
			a.evaluated = append(a.evaluated, i)
			continue
		}
		if a.byTag == nil {
			a.byTag = make(map[string][]byte)
		}
		for _, t := range tags {
			bits := a.byTag[t]
			if bits == nil {
				bits = make([]byte, size)
				a.byTag[t] = bits
			}
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return a
}

// bySetPool holds audiences' bySet maps, empty.
var bySetPool = sync.Pool{New: func() any { return map[*tag.Set]string{} }}

// release gives back what newAudiences took from pools; a is not used afterwards.
func (a *audiences) release() {
	if a.bySet != nil {
		clear(a.bySet)
		bySetPool.Put(a.bySet)
		a.bySet = nil
	}
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
		key = a.audience(set, c.uid)
		if t := a.thinnedFor[set]; t != nil {
			key = string(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32([]byte(key), t.Normal), t.Bulk))
			if a.thinned == nil {
				a.thinned = make(map[string]*clientpb.Thinned)
			}
			a.thinned[key] = t
		}
		a.bySet[set] = key
	}
	return key
}

// thinnedOf returns what the budgets left out for the members of audience key (nil for none).
func (a *audiences) thinnedOf(key string) *clientpb.Thinned { return a.thinned[key] }

// audience returns the bitset of the messages a member with tag set set and uid may see: bit i
// is set when message i has no tag expression or the member satisfies it, and the budgets did
// not leave it out for set.
func (a *audiences) audience(set *tag.Set, uid string) string {
	bits := a.scratch
	copy(bits, a.always)
	if a.byTag != nil && set != nil {
		for _, t := range set.Tags {
			for j, b := range a.byTag[t] {
				bits[j] |= b
			}
		}
	}
	for _, i := range a.evaluated {
		if a.exprs[i].Eval(set, uid) {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	for _, i := range a.skipped {
		if _, skipped := a.msgs[i].skip[set]; skipped {
			bits[i/8] &^= 1 << (i % 8)
		}
	}
	if key, ok := a.keys[string(bits)]; ok { // no string is made for the lookup
		return key
	}
	key := string(bits)
	a.keys[key] = key
	return key
}
