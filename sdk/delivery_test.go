package sdk

import (
	"fmt"
	"testing"
	"time"

	"roomcast/proto/clientpb"
)

func msg(id string, ms int64) *clientpb.Message {
	return &clientpb.Message{Id: id, ServerTimeMs: ms, Body: []byte(id)}
}

// drain returns what the delivery queued, as message ids and event kinds.
func drain(d *delivery) []string {
	d.mu.Lock()
	items := d.queue
	d.queue, d.queued = nil, 0
	d.mu.Unlock()
	var out []string
	for _, it := range items {
		switch ev := it.ev.(type) {
		case nil:
			if it.ack != "" {
				out = append(out, "ack:"+it.ack) // a copy of an at-least-once message to acknowledge
				continue
			}
			out = append(out, it.msg.GetId())
		case *RecoveredEvent:
			out = append(out, fmt.Sprintf("recovered(%v,%d,%d)", ev.Recovered, ev.Missing, ev.Count))
		case *ThinnedEvent:
			out = append(out, fmt.Sprintf("thinned(%d,%d)", ev.Normal, ev.Bulk))
		case *RecalledEvent:
			out = append(out, "recalled:"+ev.ID)
		default:
			out = append(out, fmt.Sprintf("%T", ev))
		}
	}
	return out
}

// TestDeliveryHoldsLiveMessagesForHistory: after a login that asked to recover, live messages
// wait for the history; then everything goes out once, by (server time, id), and the
// RecoveredEvent after it. Pushes of an older connection are ignored.
func TestDeliveryHoldsLiveMessagesForHistory(t *testing.T) {
	d := newDelivery(&Config{DedupeWindow: 100, MessageBuffer: 100, RecoveryWait: time.Minute})
	ack := &ConnectedEvent{LoginAck: &clientpb.LoginAck{ServerTimeMs: 1}}
	d.loggedIn(1, ack, &clientpb.Login{})
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("b", 20), msg("a", 10)}})
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent a b]" {
		t.Fatalf("live messages: %s", got)
	}

	d.loggedIn(2, ack, &clientpb.Login{RecoverSince: "b"})
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("x", 99)}}) // the old connection
	d.push(2, &clientpb.Push{Messages: []*clientpb.Message{msg("e", 50)}, Thinned: &clientpb.Thinned{Bulk: 3}})
	d.push(2, &clientpb.Push{Messages: []*clientpb.Message{msg("d", 40)}})
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent thinned(0,3)]" {
		t.Fatalf("while holding: %s", got)
	}
	d.push(2, &clientpb.Push{History: true, Messages: []*clientpb.Message{msg("b", 20), msg("c", 30), msg("d", 40)},
		Recovery: &clientpb.Recovery{Recovered: false, Missing: 4}})
	if got := fmt.Sprint(drain(d)); got != "[c d e recovered(false,4,1)]" {
		t.Fatalf("after the history: %s", got)
	}
	if since, _ := d.recoverFrom(); since != "e" {
		t.Errorf("recover from %q, want e", since)
	}
}

func TestDeliveryHoldTimesOut(t *testing.T) {
	d := newDelivery(&Config{DedupeWindow: 100, MessageBuffer: 100, RecoveryWait: 10 * time.Millisecond})
	d.loggedIn(1, &ConnectedEvent{LoginAck: &clientpb.LoginAck{}}, &clientpb.Login{History: 5})
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("a", 1)}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		held := d.hold != nil
		d.mu.Unlock()
		if !held || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent a recovered(false,0,0)]" {
		t.Fatalf("after the wait: %s", got)
	}
}

func TestDeliveryWindowAndLimit(t *testing.T) {
	d := newDelivery(&Config{DedupeWindow: 2, MessageBuffer: 3, RecoveryWait: time.Minute})
	d.loggedIn(1, &ConnectedEvent{LoginAck: &clientpb.LoginAck{}}, &clientpb.Login{})
	for _, id := range []string{"a", "b", "a", "c", "a"} { // "a" is forgotten after b and c
		d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg(id, 1)}})
	}
	if got := fmt.Sprint(drain(d)); got != "[*sdk.ConnectedEvent a b c a]" {
		t.Fatalf("with a window of 2: %s", got)
	}
	for i, want := range []bool{true, true, true, false} {
		if ok := d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg(fmt.Sprint(i), 1)}}); ok != want {
			t.Errorf("message %d queued: push = %v, want %v (a limit of 3)", i+1, ok, want)
		}
	}
}

func TestIDFloor(t *testing.T) {
	// An id of the ChatLink's (internal/ids): 2025-11-29 21:20:00.123 UTC.
	const id, ms = "01KB8QSB3VZZZZZZZZZZZZZZZZ", 1764451200123
	if f := idFloor(ms); f != "01KB8QSB3V0000000000000000" || f > id || f <= idFloor(ms-1) {
		t.Errorf("idFloor(%d) = %s, want 01KB8QSB3V0000000000000000, below %s and above the millisecond before", ms, f, id)
	}
}

// TestDeliveryPlayout: in CDN mode pushed and segment messages wait for their play time and
// come out merged in (server time, id) order, a duplicate dropped and one that comes after a
// later one counted late; the segment's messages do not move where a reconnect recovers from.
// Mode off hands on what is held at once.
func TestDeliveryPlayout(t *testing.T) {
	d := newDelivery(&Config{DedupeWindow: 100, MessageBuffer: 100, RecoveryWait: time.Minute})
	d.loggedIn(1, &ConnectedEvent{LoginAck: &clientpb.LoginAck{ServerTimeMs: 1}}, &clientpb.Login{})
	drain(d)
	now := time.Now().UnixMilli()
	d.setPlayout(time.Hour, 0)
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{msg("c2", now+20), msg("c1", now-10)}})
	d.segment([]*clientpb.Message{msg("z1", now), msg("z2", now+30), msg("c1", now-10)})
	if got := fmt.Sprint(drain(d)); got != "[]" {
		t.Fatalf("handed on before their play time: %s", got)
	}
	at := time.UnixMilli(now).Add(time.Hour + 5*time.Millisecond) // the first two are due
	play := func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.playLocked(at)
	}
	play()
	if got := fmt.Sprint(drain(d)); got != "[c1 z1]" {
		t.Fatalf("at the play time of the first two: %s", got)
	}
	d.segment([]*clientpb.Message{msg("z0", now-50)}) // after its play time, and after z1
	play()
	if got := fmt.Sprint(drain(d)); got != "[z0]" {
		t.Fatalf("a late message: %s", got)
	}
	if since, _ := d.recoverFrom(); since != "c2" {
		t.Errorf("recover from %q, want c2 (the pushed ones only)", since)
	}
	d.setPlayout(0, 0)
	if got := fmt.Sprint(drain(d)); got != "[c2 z2]" {
		t.Fatalf("mode off: %s", got)
	}
	if late, dup, fromSegments := d.playStats(); late != 1 || dup != 1 || fromSegments != 3 {
		t.Errorf("late %d, duplicates %d, from segments %d; want 1, 1, 3", late, dup, fromSegments)
	}
	if since, _ := d.recoverFrom(); since != "c2" {
		t.Errorf("recover from %q after the playout, want c2", since)
	}
}
