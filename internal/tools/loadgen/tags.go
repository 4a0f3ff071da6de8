package loadgen

import (
	"math/bits"
	"strconv"
	"strings"
)

// The tag scheme of a targeted fanout run (`--tags G`, G > 0):
//
//   - member i is in group g = i mod G and class g mod 10, and logs in with the tags
//     {"g:<g>", "c:<g mod 10>"}: G distinct tag sets in (at most) 10 classes;
//   - message seq has a tag expression chosen from seq alone, so that every worker process
//     knows each message's audience. With k = (seq/2) mod 10:
//     even seq: `"c:<k>" in tags`, one class (1/10 of the members when 10 divides G);
//     odd seq: `"c:<k>" in tags || "c:<k'>" in tags || "g:<h>" in tags`, two classes and one
//     group, with k' = (k + 1 + (seq/20) mod 9) mod 10 (never k) and h = (seq/2 * 7919) mod G
//     (its class may be k or k', in which case it adds no one).
//
// An untargeted run (G = 0) has no tags and no expressions: every member gets every message.
type tagging struct {
	groups int // G; 0: untargeted
}

// classes is how many classes the groups fall into.
const classes = 10

// hashStep spreads the odd messages' group over the groups (a prime, so it cycles through
// all of them whenever G is not a multiple of it).
const hashStep = 7919

// target is the audience of one message.
type target struct {
	all     bool   // untargeted
	classes [2]int // classes selected; the second is -1 for a one-class message
	group   int    // a group selected besides the classes, or -1
}

// numGroups is the number of distinct audiences a member can be in: G, or 1 when untargeted.
func (t tagging) numGroups() int { return max(t.groups, 1) }

// group is member i's group.
func (t tagging) group(i int) int {
	if t.groups <= 0 {
		return 0
	}
	return i % t.groups
}

// memberTags are member i's login tags; nil when untargeted.
func (t tagging) memberTags(i int) []string {
	if t.groups <= 0 {
		return nil
	}
	g := t.group(i)
	return []string{"g:" + strconv.Itoa(g), "c:" + strconv.Itoa(g%classes)}
}

// target is message seq's audience.
func (t tagging) target(seq uint64) target {
	if t.groups <= 0 {
		return target{all: true}
	}
	k := int(seq / 2 % classes)
	if seq%2 == 0 {
		return target{classes: [2]int{k, -1}, group: -1}
	}
	k2 := (k + 1 + int(seq/20%(classes-1))) % classes
	h := int(seq / 2 * hashStep % uint64(t.groups))
	return target{classes: [2]int{k, k2}, group: h}
}

// expr is the tag expression the publisher sends with the message; "" when untargeted.
func (tg target) expr() string {
	if tg.all {
		return ""
	}
	var b strings.Builder
	for i, c := range tg.classes {
		if c < 0 {
			continue
		}
		if i > 0 {
			b.WriteString(" || ")
		}
		b.WriteString(`"c:` + strconv.Itoa(c) + `" in tags`)
	}
	if tg.group >= 0 {
		b.WriteString(` || "g:` + strconv.Itoa(tg.group) + `" in tags`)
	}
	return b.String()
}

// selects reports whether a member of group g is in the audience.
func (tg target) selects(g int) bool {
	if tg.all {
		return true
	}
	c := g % classes
	return c == tg.classes[0] || c == tg.classes[1] || g == tg.group
}

// audienceSize is how many of the members counted by group (members per group) the message
// reaches.
func (tg target) audienceSize(byGroup []int64) int64 {
	var n int64
	for g, k := range byGroup {
		if tg.selects(g) {
			n += k
		}
	}
	return n
}

// expectedByGroup is, for each group, how many of the accepted messages its members should
// receive.
func (t tagging) expectedByGroup(accepted seqSet) []int64 {
	exp := make([]int64, t.numGroups())
	accepted.each(func(seq uint64) {
		tg := t.target(seq)
		for g := range exp {
			if tg.selects(g) {
				exp[g]++
			}
		}
	})
	return exp
}

// seqSet is a set of sequence numbers, as a bitmap. It travels to worker processes as JSON.
type seqSet []uint64

func (s *seqSet) add(seq uint64) {
	w := int(seq / 64)
	if w >= len(*s) {
		*s = append(*s, make([]uint64, w+1-len(*s))...)
	}
	(*s)[w] |= 1 << (seq % 64)
}

func (s seqSet) has(seq uint64) bool {
	w := seq / 64
	return w < uint64(len(s)) && s[w]&(1<<(seq%64)) != 0
}

func (s seqSet) len() int64 {
	var n int
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}

// each calls f for every member of the set, in increasing order.
func (s seqSet) each(f func(seq uint64)) {
	for i, w := range s {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			f(uint64(i)*64 + uint64(b))
			w &= w - 1
		}
	}
}
