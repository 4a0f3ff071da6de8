package cdnpusher

import (
	"cmp"
	"math/rand/v2"
	"slices"

	"go.opentelemetry.io/otel/trace"

	"roomcast/proto/clientpb"
)

// Priority classes, highest first: the order of a segment and of what the cap keeps.
const (
	classCritical = iota
	classNormal
	classBulk
	numClasses
)

// classOf maps a lane to its class. An unspecified or unknown lane is normal, as everywhere else.
func classOf(l clientpb.Lane) int {
	switch l {
	case clientpb.Lane_LANE_CRITICAL:
		return classCritical
	case clientpb.Lane_LANE_BULK:
		return classBulk
	}
	return classNormal
}

// reservoir keeps a uniform sample of at most cap of the messages offered to it (Vitter's
// algorithm R): the k-th message replaces a kept one with probability cap/k, so a flood late in
// the window is as likely to be kept as the first messages, and memory stays at cap.
type reservoir struct {
	seen int
	kept []*clientpb.Message
}

func (r *reservoir) offer(m *clientpb.Message, capacity int, rng *rand.Rand) {
	r.seen++
	if len(r.kept) < capacity {
		r.kept = append(r.kept, m)
		return
	}
	if j := rng.IntN(r.seen); j < capacity {
		r.kept[j] = m
	}
}

// window gathers one room's messages of one time window, a reservoir per class. Each reservoir
// holds up to the cap because how much room a lower class gets is known only when the window
// closes.
type window struct {
	classes [numClasses]reservoir
	// traced are the sampled spans of the batches that brought its messages (tracing on), at
	// most maxSegmentLinks: its segment's write is traced under them.
	traced []trace.SpanContext
}

// maxSegmentLinks bounds the batches a segment's write span links to.
const maxSegmentLinks = 32

func (w *window) add(m *clientpb.Message, capacity int, rng *rand.Rand, from trace.SpanContext) {
	w.classes[classOf(m.Lane)].offer(m, capacity, rng)
	if from.IsSampled() && len(w.traced) < maxSegmentLinks && (len(w.traced) == 0 || !w.traced[len(w.traced)-1].Equal(from)) {
		w.traced = append(w.traced, from)
	}
}

// take returns what the window's segment carries: at most capacity messages, classes in
// priority order, a class that does not fit whole reduced to a uniform sample of the room left;
// and how many messages were sampled away. The messages are not yet sorted (see order). It
// leaves w empty, ready for reuse.
func (w *window) take(capacity int, rng *rand.Rand) (msgs []*clientpb.Message, sampled int) {
	n := 0
	for c := range w.classes {
		n += len(w.classes[c].kept)
	}
	msgs = make([]*clientpb.Message, 0, min(n, capacity))
	for c := range w.classes {
		r := &w.classes[c]
		room := capacity - len(msgs)
		if len(r.kept) > room {
			// A uniform subset of a uniform sample is a uniform sample: shuffle the first room
			// places (partial Fisher-Yates) and keep them.
			for i := range room {
				j := i + rng.IntN(len(r.kept)-i)
				r.kept[i], r.kept[j] = r.kept[j], r.kept[i]
			}
			msgs = append(msgs, r.kept[:room]...)
			sampled += r.seen - room
		} else {
			msgs = append(msgs, r.kept...)
			sampled += r.seen - len(r.kept)
		}
		clear(r.kept)
		r.kept, r.seen = r.kept[:0], 0
	}
	return msgs, sampled
}

// order sorts a segment's messages: class, then server time, then id (ids are unique and sort
// by time, so this is a total order).
func order(msgs []*clientpb.Message) {
	slices.SortFunc(msgs, func(a, b *clientpb.Message) int {
		if c := cmp.Compare(classOf(a.Lane), classOf(b.Lane)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.ServerTimeMs, b.ServerTimeMs); c != 0 {
			return c
		}
		return cmp.Compare(a.Id, b.Id)
	})
}
