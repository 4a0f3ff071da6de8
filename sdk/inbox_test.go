package sdk

import (
	"slices"
	"testing"
	"time"

	"roomcast/proto/clientpb"
)

// TestDeliveryInboxCopies: an at-least-once message goes to the app once; a copy that comes
// while it is still queued is dropped (its original will be acknowledged), a copy after it was
// handed on is acknowledged again without reaching the app. It goes out at once, even while a
// history answer holds the room's messages, and does not move where recovery starts.
func TestDeliveryInboxCopies(t *testing.T) {
	t.Parallel()
	d := newDelivery(&Config{DedupeWindow: 10, MessageBuffer: 100, RecoveryWait: time.Hour})
	d.loggedIn(1, &ConnectedEvent{LoginAck: &clientpb.LoginAck{ServerTimeMs: 1}}, &clientpb.Login{History: 10})
	drain(d) // the ConnectedEvent
	alo := &clientpb.Message{Id: "01KB0000000000000000000009", ServerTimeMs: 9, AtLeastOnce: true}
	room := msg("01KB0000000000000000000001", 1)

	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{room, alo}})
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{alo}})
	if got, want := drain(d), []string{alo.Id}; !slices.Equal(got, want) {
		t.Fatalf("queued %q, want %q (the room message held for the history, the copy dropped)", got, want)
	}
	d.handedOn(alo.Id)
	d.push(1, &clientpb.Push{Messages: []*clientpb.Message{alo}})
	if got, want := drain(d), []string{"ack:" + alo.Id}; !slices.Equal(got, want) {
		t.Fatalf("queued %q, want %q", got, want)
	}
	if since, _ := d.recoverFrom(); since != room.Id {
		t.Errorf("recovery starts at %q, want the room message's id %q", since, room.Id)
	}
}
