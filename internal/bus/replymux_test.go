package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
)

// subsOf returns how many subscriptions the server holds for nc.
func subsOf(t *testing.T, ns *server.Server, nc *nats.Conn) int {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	cz, err := ns.Connz(&server.ConnzOptions{CID: cid})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("connz of %d: %v, %v", cid, cz, err)
	}
	return int(cz.Conns[0].NumSubs)
}

// testStream is a stream like the rooms' history (store/historystore): one subject per room
// (testSubject), read with direct gets.
const testStream = "rc_test"

func testSubject(room string) string { return "rc.test." + room }

// directGetStream starts an embedded NATS server with testStream and connects to it.
func directGetStream(t testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns := testkit.NATS(t)
	nc := testkit.Connect(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: testStream, Subjects: []string{testSubject("*")}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	return ns, nc, js
}

// readAll reads a room's messages from testStream with direct gets of 3 messages, and returns
// their ids.
func readAll(ctx context.Context, nc *nats.Conn, room string) ([]string, error) {
	req := DirectGetRequest{Seq: 1, NextFor: testSubject(room), Batch: 3}
	var ids []string
	for {
		more, err := DirectGet(ctx, nc, testStream, req, func(seq uint64, entry *nats.Msg) {
			req.Seq = seq + 1
			var m clientpb.Message
			if proto.Unmarshal(entry.Data, &m) == nil {
				ids = append(ids, m.Id)
			}
		})
		if err != nil || !more {
			return ids, err
		}
	}
}

// directGetResponder connects to ns in JetStream's place: the direct gets of testStream
// come to requests, for the test to answer on js as JetStream does (ADR-31). No stream answers
// them: ns has none.
func directGetResponder(t *testing.T, ns *server.Server) (js *nats.Conn, requests chan *nats.Msg) {
	t.Helper()
	js = testkit.Connect(t, ns)
	requests = make(chan *nats.Msg, 64)
	if _, err := js.ChanSubscribe("$JS.API.DIRECT.GET."+testStream, requests); err != nil {
		t.Fatal(err)
	}
	if err := js.Flush(); err != nil {
		t.Fatal(err)
	}
	return js, requests
}

// TestDirectGetsShareOneSubscription makes many direct gets at once on one connection: the
// server holds one subscription for all their answers, each read gets its own answer, in order,
// however the answers of the reads interleave, with each way an answer can end; answers after
// the end, and the answer to a read that gave up, are dropped. The test answers in JetStream's
// place, so that all the reads are in flight at once.
func TestDirectGetsShareOneSubscription(t *testing.T) {
	t.Parallel()
	ns := testkit.NATS(t)
	nc := testkit.Connect(t, ns)
	js, requests := directGetResponder(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := func() (reply string, read int) {
		t.Helper()
		select {
		case req := <-requests:
			var r DirectGetRequest
			if err := json.Unmarshal(req.Data, &r); err != nil {
				t.Fatal(err)
			}
			read, _ = strconv.Atoi(r.NextFor)
			return req.Reply, read
		case <-ctx.Done():
			t.Fatal("a request did not come")
		}
		return "", 0
	}
	answer := func(reply string, hdr nats.Header, data string) {
		t.Helper()
		if err := js.PublishMsg(&nats.Msg{Subject: reply, Header: hdr, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
	}

	type result struct {
		got  []string // "seq:data" in the order take had them
		more bool
		err  error
	}
	const reads = 20
	results := make([]result, reads)
	var wg sync.WaitGroup
	for i := range reads {
		wg.Go(func() {
			r := &results[i]
			r.more, r.err = DirectGet(ctx, nc, testStream, DirectGetRequest{NextFor: strconv.Itoa(i), Batch: 3}, func(seq uint64, entry *nats.Msg) {
				r.got = append(r.got, fmt.Sprintf("%d:%s", seq, entry.Data))
			})
		})
	}
	replies := make([]string, reads)
	for range reads {
		reply, i := next()
		replies[i] = reply
	}
	if n := subsOf(t, ns, nc); n != 1 {
		t.Errorf("%d reads in flight hold %d subscriptions on the server, want 1", reads, n)
	}

	// Each read i ends the way i%5 picks; those that get messages get 3, sent round-robin.
	ends := []nats.Header{
		{"Status": {"204"}, "Nats-Num-Pending": {"5"}},
		{"Status": {"204"}, "Nats-Num-Pending": {"0"}},
		{"Status": {"404"}},
		{"Status": {"503"}},
		{"Status": {"400"}, "Description": {"Bad Request"}},
	}
	withMessages := func(i int) bool { return i%5 != 2 && i%5 != 3 }
	for k := range 3 {
		for i, reply := range replies {
			if withMessages(i) {
				answer(reply, nats.Header{"Nats-Sequence": {strconv.Itoa(100*i + k)}}, fmt.Sprintf("m%d.%d", i, k))
			}
		}
	}
	for i, reply := range replies {
		answer(reply, ends[i%5], "")
		answer(reply, nats.Header{"Nats-Sequence": {"1"}}, "after the end") // dropped
	}
	wg.Wait()
	for i, r := range results {
		var want []string
		if withMessages(i) {
			for k := range 3 {
				want = append(want, fmt.Sprintf("%d:m%d.%d", 100*i+k, i, k))
			}
		}
		wantMore, wantErr := i%5 == 0, i%5 >= 3
		if !slices.Equal(r.got, want) || r.more != wantMore || (r.err != nil) != wantErr || (wantErr && !errors.Is(r.err, errDirectGet)) {
			t.Errorf("read %d: %v, more %v, err %v; want %v, more %v, an error %v", i, r.got, r.more, r.err, want, wantMore, wantErr)
		}
	}

	// A read that gives up before its answer comes.
	gaveUp, giveUp := context.WithCancel(ctx)
	took := 0
	done := make(chan error, 1)
	go func() {
		_, err := DirectGet(gaveUp, nc, testStream, DirectGetRequest{NextFor: "late", Batch: 3}, func(uint64, *nats.Msg) { took++ })
		done <- err
	}()
	reply, _ := next()
	giveUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a read that gave up: %v", err)
	}
	answer(reply, nats.Header{"Nats-Sequence": {"7"}}, "late")
	answer(reply, ends[1], "")

	mux, err := replyMuxOf(nc)
	if err != nil {
		t.Fatal(err)
	}
	wantLate := uint64(reads + 2)
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := mux.late.Load(); n != wantLate {
			return fmt.Errorf("%d answers dropped as late, want %d", n, wantLate)
		}
		return nil
	})
	mux.mu.Lock()
	left := len(mux.waits)
	mux.mu.Unlock()
	if took != 0 || left != 0 {
		t.Errorf("the late answer was taken %d times; %d reads still registered", took, left)
	}
	if n := subsOf(t, ns, nc); n != 1 {
		t.Errorf("%d subscriptions on the server after the reads, want 1", n)
	}
}

// TestReplyMuxEndsWithConnection closes a connection during a read: the read fails at once
// rather than at its deadline, and the mux is forgotten (by its subscription's goroutine, as
// that ends).
func TestReplyMuxEndsWithConnection(t *testing.T) {
	t.Parallel()
	ns := testkit.NATS(t)
	nc := testkit.Connect(t, ns)
	_, requests := directGetResponder(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := DirectGet(ctx, nc, testStream, DirectGetRequest{NextFor: "r", Batch: 3}, func(uint64, *nats.Msg) {})
		done <- err
	}()
	select {
	case <-requests:
	case <-ctx.Done():
		t.Fatal("no request")
	}
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("a read when its connection closed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the read did not end when its connection closed")
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if _, ok := replyMuxes.Load(nc); ok {
			return errors.New("the closed connection's mux is still held")
		}
		return nil
	})
}

// TestDirectGetsConcurrent reads many rooms at once from JetStream over several batches each:
// every read has its own room's messages, in order, and the connection holds one subscription.
func TestDirectGetsConcurrent(t *testing.T) {
	t.Parallel()
	ns, nc, js := directGetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const rooms, perRoom = 16, 5
	for k := range perRoom {
		for i := range rooms {
			b, _ := proto.Marshal(&clientpb.Message{Id: fmt.Sprintf("%d.%d", i, k)})
			if _, err := js.Publish(ctx, testSubject(strconv.Itoa(i)), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := subsOf(t, ns, nc) // nats.go's request mux, made by the publishes
	var wg sync.WaitGroup
	for i := range rooms {
		wg.Go(func() {
			got, err := readAll(ctx, nc, strconv.Itoa(i))
			var want []string
			for k := range perRoom {
				want = append(want, fmt.Sprintf("%d.%d", i, k))
			}
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("room %d: %v (%v)", i, got, err)
			}
		})
	}
	wg.Wait()
	if n := subsOf(t, ns, nc) - before; n != 1 {
		t.Errorf("%d reads left %d more subscriptions on the server, want 1", rooms, n)
	}
}

// TestReplyMuxSurvivesReconnect reads a room's messages before and after the connection
// reconnects: the same mux serves both, its subscription sent again by nats.go.
func TestReplyMuxSurvivesReconnect(t *testing.T) {
	t.Parallel()
	_, nc, js := directGetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, _ := proto.Marshal(&clientpb.Message{Id: "m"})
	if _, err := js.Publish(ctx, testSubject("r"), b); err != nil {
		t.Fatal(err)
	}
	read := func() {
		t.Helper()
		if ids, err := readAll(ctx, nc, "r"); err != nil || len(ids) != 1 {
			t.Fatalf("read %d messages (%v), want 1", len(ids), err)
		}
	}
	read()
	before, err := replyMuxOf(nc)
	if err != nil {
		t.Fatal(err)
	}
	cid, _ := nc.GetClientID()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if now, _ := nc.GetClientID(); !nc.IsConnected() || now == cid {
			return errors.New("not reconnected yet")
		}
		return nil
	})
	read()
	if after, err := replyMuxOf(nc); err != nil || after != before {
		t.Errorf("a new mux after the reconnect (%v)", err)
	}
}
