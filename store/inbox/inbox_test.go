package inbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/store/inbox"
)

// startJS starts an embedded NATS server with JetStream and returns a JetStream context on it.
func startJS(t testing.TB) jetstream.JetStream {
	t.Helper()
	s := testkit.NATS(t)
	nc := testkit.Connect(t, s, nats.InProcessServer(s)) // as roomcast dev connects
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func ids(stored []inbox.Stored) []string {
	var out []string
	for _, s := range stored {
		out = append(out, s.Message.Id)
	}
	return out
}

// TestStore: messages are kept per user, in order; a full user refuses new ones and keeps the
// old; Ack removes only the user's own messages named, with or without known sequences; a
// reader finds nothing before the stream exists.
func TestStore(t *testing.T) {
	t.Parallel()
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	reader := inbox.NewReader(js)
	if got, err := reader.List(ctx, "app", "ann"); err != nil || len(got) != 0 {
		t.Fatalf("before the stream exists: %v, %v", got, err)
	}
	st, err := inbox.Open(ctx, js, inbox.Config{MaxPerUser: 3})
	if err != nil {
		t.Fatal(err)
	}
	put := func(uid, id string) error {
		return st.Put(ctx, "app", uid, &clientpb.Message{Id: id, AtLeastOnce: true}, time.Hour)
	}
	for _, id := range []string{"A1", "A2", "A3"} {
		if err := put("ann", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := put("ann", "A4"); !errors.Is(err, inbox.ErrFull) {
		t.Fatalf("fourth put: %v, want ErrFull", err)
	}
	if err := put("ben", "B1"); err != nil {
		t.Fatal(err)
	}
	stored, err := reader.List(ctx, "app", "ann")
	if err != nil || !slices.Equal(ids(stored), []string{"A1", "A2", "A3"}) {
		t.Fatalf("ann's: %v, %v", ids(stored), err)
	}

	// ben acknowledges ann's id: nothing of ann's goes.
	if n, err := st.Ack(ctx, "app", "ben", []string{"A1"}, nil); err != nil || n != 0 {
		t.Fatalf("another user's ack removed %d (%v)", n, err)
	}
	// A known sequence, and one found by reading.
	if n, err := reader.Ack(ctx, "app", "ann", []string{"A1"}, map[string]uint64{"A1": stored[0].Seq}); err != nil || n != 1 {
		t.Fatalf("ack with a known sequence: %d, %v", n, err)
	}
	if n, err := reader.Ack(ctx, "app", "ann", []string{"A3", "A1", "nope"}, nil); err != nil || n != 1 {
		t.Fatalf("ack by reading: %d, %v (A1 is gone already)", n, err)
	}
	if got, _ := reader.List(ctx, "app", "ann"); !slices.Equal(ids(got), []string{"A2"}) {
		t.Fatalf("after the acks: %v, want A2", ids(got))
	}
	if err := put("ann", "A5"); err != nil {
		t.Fatalf("a put after the acks made room: %v", err)
	}
	if got, _ := reader.List(ctx, "app", "ben"); !slices.Equal(ids(got), []string{"B1"}) {
		t.Fatalf("ben's: %v", ids(got))
	}
}

// TestHolding: one read tells which users have messages stored, across apps, with a user
// asked about twice; nobody before the stream exists; and too many users at once is refused.
func TestHolding(t *testing.T) {
	t.Parallel()
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	reader := inbox.NewReader(js)
	users := []inbox.User{{"app", "ann"}, {"app", "ben"}, {"other", "ann"}, {"app", "cid"}, {"app", "ann"}}
	if has, err := reader.Holding(ctx, users); err != nil || slices.Contains(has, true) || len(has) != len(users) {
		t.Fatalf("before the stream exists: %v, %v", has, err)
	}
	st, err := inbox.Open(ctx, js, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if has, err := reader.Holding(ctx, users); err != nil || slices.Contains(has, true) {
		t.Fatalf("nothing stored: %v, %v", has, err)
	}
	for _, p := range []struct{ app, uid, id string }{{"app", "ann", "A1"}, {"app", "ann", "A2"}, {"app", "cid", "C1"}, {"third", "ben", "B1"}} {
		if err := st.Put(ctx, p.app, p.uid, &clientpb.Message{Id: p.id, AtLeastOnce: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	has, err := reader.Holding(ctx, users)
	if want := []bool{true, false, false, true, true}; err != nil || !slices.Equal(has, want) {
		t.Fatalf("Holding = %v, %v; want %v", has, err, want)
	}
	if _, err := reader.Holding(ctx, make([]inbox.User, inbox.MaxHolding+1)); err == nil {
		t.Fatalf("%d users at once: no error", inbox.MaxHolding+1)
	}
}
