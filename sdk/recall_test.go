package sdk

import (
	"fmt"
	"testing"
	"time"

	"roomcast/proto/clientpb"
)

func recallOf(ids ...string) *clientpb.Recall {
	rc := &clientpb.Recall{}
	for _, id := range ids {
		rc.Messages = append(rc.Messages, &clientpb.RecalledMessage{Id: id, RecalledMs: 1})
	}
	return rc
}

// TestDeliveryRecall: a recall takes the message out of what the Client has not handed over
// (its queue, a recovery's hold, the CDN play-out heap), and a copy that comes after it, live,
// in a recovery or in a segment, is never handed over; each recall is told once.
func TestDeliveryRecall(t *testing.T) {
	d := newDelivery(&Config{DedupeWindow: 100, MessageBuffer: 100, RecoveryWait: time.Minute})
	ack := &ConnectedEvent{LoginAck: &clientpb.LoginAck{ServerTimeMs: 1}}
	d.loggedIn(1, ack, &clientpb.Login{})

	// Queued, not yet taken by the callback goroutine.
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("a", 10), msg("b", 20)}})
	d.recall(recallOf("b"))
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent a recalled:b]" {
		t.Fatalf("a queued message recalled: %s", got)
	}
	if d.queued != 0 {
		t.Errorf("%d messages counted queued after the drain", d.queued)
	}
	// Told again (a second recall by the server API), and the copy of a recovery: nothing.
	d.recall(recallOf("b"))
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("b", 20)}})
	// Recalled before it arrives.
	d.recall(recallOf("c"))
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("c", 30), msg("d", 40)}})
	if got := fmt.Sprint(drain(d)); got != "[recalled:c d]" {
		t.Fatalf("after the recalls: %s", got)
	}

	// Held for a recovery: the live message recalled meanwhile, and its copy in the history, stay out.
	d.loggedIn(2, ack, &clientpb.Login{RecoverSince: "d"})
	d.push(2, &clientpb.Push{Messages: []*clientpb.Message{msg("f", 60)}})
	d.recall(recallOf("f"))
	d.push(2, &clientpb.Push{History: true, Messages: []*clientpb.Message{msg("e", 50), msg("f", 60)}, Recovery: &clientpb.Recovery{Recovered: true}})
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent recalled:f e recovered(true,0,1)]" {
		t.Fatalf("a held message recalled: %s", got)
	}

	// CDN mode: a segment's message waits for its play time; recalled meanwhile, it never plays.
	d.setPlayout(time.Hour, 0)
	now := time.Now().UnixMilli()
	if n := d.segment([]*clientpb.Message{msg("g", now), msg("h", now+1)}); n != 2 {
		t.Fatalf("a segment's new messages: %d, want 2", n)
	}
	d.recall(recallOf("g"))
	if n := d.segment([]*clientpb.Message{msg("g", now)}); n != 0 {
		t.Errorf("a later segment's copy of a recalled message counted new")
	}
	if got := fmt.Sprint(drain(d)); got != "[recalled:g]" {
		t.Fatalf("segment messages before their play time: %s", got)
	}
	d.setPlayout(0, 0)
	if got := fmt.Sprint(drain(d)); got != "[h]" {
		t.Fatalf("a held segment message recalled: %s", got)
	}
}
