package chatlink_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// TestRoomSeqOrderAcrossNodes: two room-service instances, two ChatLinks with a member each.
// Batches reach the nodes in another order than their numbers (injected on the room's subject,
// as two instances' windows crossing on the way), with a number missing that only the history
// has, and with a number missing everywhere. Every member gets the numbered messages in
// room_seq order, the bulk message of a held batch without waiting, the missing one from the
// history; the number missing everywhere is given up after the hold and counted, and its late
// arrival counted; a live copy of a filled message is dropped.
func TestRoomSeqOrderAcrossNodes(t *testing.T) {
	t.Parallel()
	const hold = 400 * time.Millisecond
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.ServiceInstances = 2
		cfg.ChatLink.OrderHold = hold
	})
	const room = "ordered"
	var members []*testkit.Client
	var sessions []string
	for i, n := range c.Nodes {
		m := testkit.DialTCP(t, n.TCPAddr())
		ack := m.Login(testcluster.Token(t, fmt.Sprintf("m%d", i), room))
		members = append(members, m)
		sessions = append(sessions, ack.SessionId)
	}
	// A real send through the room service numbers the room's first message.
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages", devcluster.APIKey,
		`{"type":"chat","lane":"critical","body":"MA=="}`, nil); code != http.StatusOK {
		t.Fatalf("send: %d", code)
	}
	var base uint64
	for _, m := range members {
		msgs, _ := m.CollectPushes(1)
		base = msgs[0].RoomSeq
	}
	if base == 0 {
		t.Fatal("the room service's message has no room_seq")
	}

	nc := testkit.Connect(t, c.NATS)
	msg := func(body string, seq uint64) *clientpb.Message {
		lane := clientpb.Lane_LANE_CRITICAL
		if seq == 0 {
			lane = clientpb.Lane_LANE_BULK
		}
		return &clientpb.Message{Id: body, Room: room, Type: "chat", Lane: lane, Body: []byte(body), RoomSeq: seq, ServerTimeMs: time.Now().UnixMilli()}
	}
	publish := func(msgs ...*clientpb.Message) {
		t.Helper()
		if err := bus.Publish(nc, bus.RoomSubject(devcluster.App, room), &buspb.RoomBatch{Messages: msgs}); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	bodies := func(m *testkit.Client, n int) string {
		t.Helper()
		msgs, _ := m.CollectPushes(n)
		var out []string
		for _, x := range msgs {
			out = append(out, string(x.Body))
		}
		return strings.Join(out, " ")
	}
	expect := func(want string, n int) {
		t.Helper()
		for i, m := range members {
			if got := bodies(m, n); got != want {
				t.Errorf("member on node %d got %q, want %q", i+1, got, want)
			}
		}
	}
	order := func(event string) (total int) {
		for _, n := range c.Nodes {
			total += metricValue(t, c, `roomcast_chatlink_order_total{event="`+event+`",node="`+n.Name()+`"}`)
		}
		return total
	}

	// Two windows numbered base+1 and base+2 reach the nodes the other way round.
	publish(msg("b", base+2))
	publish(msg("a", base+1))
	expect("a b", 2)

	// base+3 was kept but its live batch is lost; base+4 comes with a bulk message.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := proto.Marshal(msg("c", base+3))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, historystore.Subject(devcluster.App, room), kept); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	publish(msg("bulk", 0), msg("d", base+4))
	expect("bulk", 1) // not held
	if waited := time.Since(published); waited >= hold {
		t.Errorf("the bulk message came after %v, the whole hold", waited)
	}
	expect("c d", 2)
	if got := order("filled"); got != 2 {
		t.Errorf("filled %d, want 2 (one per node)", got)
	}

	// A live copy of c is dropped; base+5 is missing everywhere: base+6 goes out without it,
	// after the hold and the history read, and base+5 arriving after that is delivered late.
	publish(msg("c", base+3))
	publish(msg("f", base+6))
	expect("f", 1)
	publish(msg("e", base+5))
	expect("e", 1)
	for what, want := range map[string]int{"duplicate": 2, "skipped": 2, "late": 2, "held": 6} {
		if got := order(what); got != want {
			t.Errorf("order_total{event=%q} = %d, want %d", what, got, want)
		}
	}

	// base+7 was sent by the first node's member and kept in a record that names its session,
	// and its live batch is lost: the history fills it for the other member only, as live
	// delivery would have (a sender gets a SendAck, not an echo).
	rec, err := proto.Marshal(&buspb.HistoryRecord{Messages: []*clientpb.Message{msg("g", base+7)}, SenderSessions: []string{sessions[0]}})
	if err != nil {
		t.Fatal(err)
	}
	entry := nats.NewMsg(historystore.Subject(devcluster.App, room))
	entry.Header.Set(historystore.RecordHeader, "100")
	entry.Data = rec
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := js.PublishMsg(ctx2, entry); err != nil {
		t.Fatal(err)
	}
	publish(msg("h", base+8))
	if got := bodies(members[0], 1); got != "h" {
		t.Errorf("the sender's node: its member got %q, want %q (no echo of its own message)", got, "h")
	}
	if got := bodies(members[1], 2); got != "g h" {
		t.Errorf("the other node: its member got %q, want %q", got, "g h")
	}
	if got := order("filled"); got != 4 {
		t.Errorf("filled %d, want 4 (one more per node)", got)
	}
}
