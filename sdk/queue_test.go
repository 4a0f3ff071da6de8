package sdk_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestQueueViewOrdersEvents(t *testing.T) {
	t.Parallel()
	entry := func(k string) *clientpb.QueueEntry { return &clientpb.QueueEntry{Key: k} }
	offer := func(v uint64, k string) *clientpb.QueueEvent {
		return &clientpb.QueueEvent{Op: clientpb.QueueOp_QUEUE_OP_OFFER, Version: v, Entries: []*clientpb.QueueEntry{entry(k)}}
	}
	keys := func(v *sdk.QueueView) []string {
		var out []string
		for _, e := range v.Entries() {
			out = append(out, e.Key)
		}
		return out
	}
	var v sdk.QueueView
	v.Reset([]*clientpb.QueueEntry{entry("a")}, 4)
	// Version 6 before 5: it waits.
	if behind := v.Apply(offer(6, "c")); !behind || v.Version() != 4 || v.Waiting() != 1 {
		t.Fatalf("after an early event: behind %v, version %d, waiting %d", behind, v.Version(), v.Waiting())
	}
	if behind := v.Apply(offer(5, "b")); behind || v.Version() != 6 || !slices.Equal(keys(&v), []string{"a", "b", "c"}) {
		t.Fatalf("after the missing event: behind %v, version %d, %v", behind, v.Version(), keys(&v))
	}
	// Old and repeated events change nothing; a replacement keeps its place.
	v.Apply(offer(5, "b"))
	v.Apply(offer(3, "z"))
	v.Apply(offer(7, "a"))
	v.Apply(&clientpb.QueueEvent{Op: clientpb.QueueOp_QUEUE_OP_DROP, Version: 8, Entries: []*clientpb.QueueEntry{entry("b")}})
	if !slices.Equal(keys(&v), []string{"a", "c"}) || v.Version() != 8 {
		t.Fatalf("view %v at %d, want [a c] at 8", keys(&v), v.Version())
	}
	// A gap that does not close: a Reset from a listing covers it.
	v.Apply(offer(10, "e"))
	v.Reset([]*clientpb.QueueEntry{entry("c"), entry("d"), entry("e")}, 10)
	if v.Waiting() != 0 || !slices.Equal(keys(&v), []string{"c", "d", "e"}) {
		t.Fatalf("after a reset: waiting %d, %v", v.Waiting(), keys(&v))
	}
	v.Apply(&clientpb.QueueEvent{Op: clientpb.QueueOp_QUEUE_OP_CLEAR, Version: 11})
	if len(v.Entries()) != 0 {
		t.Fatalf("after a clear: %v", keys(&v))
	}
}

func TestQueueEventOf(t *testing.T) {
	t.Parallel()
	body, _ := proto.Marshal(&clientpb.QueueEvent{Op: clientpb.QueueOp_QUEUE_OP_CLEAR, Version: 3})
	for _, c := range []struct {
		name string
		m    *clientpb.Message
		ok   bool
	}{
		{"a change", &clientpb.Message{Type: sdk.QueueEventType, Lane: clientpb.Lane_LANE_CRITICAL, Body: body}, true},
		{"from a member", &clientpb.Message{Type: sdk.QueueEventType, Sender: "mallory", Lane: clientpb.Lane_LANE_CRITICAL, Body: body}, false},
		{"another type", &clientpb.Message{Type: "chat", Lane: clientpb.Lane_LANE_CRITICAL, Body: body}, false},
		{"not critical", &clientpb.Message{Type: sdk.QueueEventType, Lane: clientpb.Lane_LANE_NORMAL, Body: body}, false},
		{"garbage", &clientpb.Message{Type: sdk.QueueEventType, Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte{0xff}}, false},
	} {
		if ev, ok := sdk.QueueEventOf(c.m); ok != c.ok || (ok && ev.Version != 3) {
			t.Errorf("%s: %v %v, want ok=%v", c.name, ev, ok, c.ok)
		}
	}
}
