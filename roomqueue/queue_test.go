package roomqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// member is an SDK client in a room that keeps a QueueView from the room's queue events.
type member struct {
	*sdk.Client
	mu   sync.Mutex // guards view and events
	view sdk.QueueView
	// events counts the queue events received, by version, to catch one delivered twice.
	events map[uint64]int
}

// join logs uid into room on node (0-based) of c over TCP.
func join(t *testing.T, c *devcluster.Cluster, node int, uid, room string, tags ...string) *member {
	t.Helper()
	m := &member{events: make(map[uint64]int)}
	n := c.Nodes[node]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, sdk.Config{
		Token:     testcluster.Token(t, uid, room, tags...),
		Endpoints: []sdk.Endpoint{{Node: n.Name(), TCPAddr: n.TCPAddr(), WSURL: n.WSURL()}},
		Transport: "tcp",
		OnMessage: func(msg *clientpb.Message) {
			if ev, ok := sdk.QueueEventOf(msg); ok {
				m.mu.Lock()
				m.events[ev.Version]++
				m.view.Apply(ev)
				m.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatalf("dial %s: %v", uid, err)
	}
	t.Cleanup(func() { cl.Close() })
	m.Client = cl
	return m
}

// keys lists entries' keys in order.
func keys(entries []*clientpb.QueueEntry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

// agrees checks that m's view, built from the broadcasts alone, is the queue as listed, and
// that no event came twice.
func (m *member) agrees(want []string, version uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if got := keys(m.view.Entries()); !slices.Equal(got, want) || m.view.Version() != version {
		return fmt.Errorf("a member's view from the broadcasts is %v at version %d; the queue lists %v at version %d", got, m.view.Version(), want, version)
	}
	for v, n := range m.events {
		if n != 1 {
			return fmt.Errorf("event version %d came %d times", v, n)
		}
	}
	return nil
}

func list(t *testing.T, m *member) ([]string, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	entries, version, err := m.QueueList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return keys(entries), version
}

// TestGrabTheMic has members on two ChatLinks, served by two queue instances, offer one key with
// IfAbsent at the same moment, round after round: exactly one wins each round, and every member
// sees the same winner.
func TestGrabTheMic(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.ServiceInstances = 2, 2 })
	const n = 6
	members := make([]*member, n)
	for i := range members {
		members[i] = join(t, c, i%2, fmt.Sprintf("u%d", i), "stage")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round := range 5 {
		start := make(chan struct{})
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, m := range members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = m.QueueOffer(ctx, "mic", []byte(fmt.Sprintf("round %d", round)), sdk.OfferOptions{IfAbsent: true})
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: u%d and u%d both got the mic", round, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, sdk.ErrQueueKeyExists):
				t.Fatalf("round %d: u%d: %v, want ErrQueueKeyExists", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody got the mic: %v", round, errs)
		}
		head, err := members[0].QueuePeek(ctx, "")
		if err != nil || head.Key != "mic" || head.Uid != fmt.Sprintf("u%d", winner) {
			t.Fatalf("round %d: head %v %v, want the mic held by u%d", round, head, err, winner)
		}
		// The winner hands the mic back: only the owner may take it (or an admin).
		if _, err := members[(winner+1)%n].QueuePoll(ctx, "mic"); !errors.Is(err, &sdk.QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)}) {
			t.Fatalf("round %d: another member polled the winner's mic: %v", round, err)
		}
		if _, err := members[winner].QueuePoll(ctx, "mic"); err != nil {
			t.Fatalf("round %d: the winner's poll: %v", round, err)
		}
	}
	want, version := list(t, members[0])
	if len(want) != 0 || version != 10 {
		t.Fatalf("after 5 rounds the queue lists %v at version %d, want [] at 10", want, version)
	}
	for _, m := range members {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return m.agrees(want, version) })
	}
}

// TestConcurrentOffersOrder has members on two ChatLinks offer at once, each several keys in
// turn: the queue keeps one order, every member's view built from the broadcasts is that order,
// and each member's own offers keep the order it made them in.
func TestConcurrentOffersOrder(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) { cfg.ChatLinks, cfg.ServiceInstances = 2, 2 })
	const n, each = 6, 5
	members := make([]*member, n)
	for i := range members {
		members[i] = join(t, c, i%2, fmt.Sprintf("u%d", i), "line")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := make(chan struct{})
	errs := make(chan error, n*each)
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for k := range each {
				if _, err := m.QueueOffer(ctx, fmt.Sprintf("u%d.%d", i, k), []byte("v"), sdk.OfferOptions{}); err != nil {
					errs <- err
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want, version := list(t, members[0])
	if len(want) != n*each || version != n*each {
		t.Fatalf("the queue lists %d entries at version %d, want %d at %d", len(want), version, n*each, n*each)
	}
	for i := range members {
		var own []string
		for _, k := range want {
			var who, seq int
			if _, err := fmt.Sscanf(k, "u%d.%d", &who, &seq); err == nil && who == i {
				own = append(own, k)
			}
		}
		for k := range own {
			if own[k] != fmt.Sprintf("u%d.%d", i, k) {
				t.Fatalf("u%d's offers are out of order in %v", i, want)
			}
		}
	}
	for _, m := range members {
		if got, v := list(t, m); !slices.Equal(got, want) || v != version {
			t.Fatalf("members list different queues: %v at %d and %v at %d", got, v, want, version)
		}
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return m.agrees(want, version) })
	}
}

// TestDropOnLeaveWhenNodeKilled offers entries from a member on a ChatLink that then dies
// without a goodbye: its drop-on-leave entry goes within the node's lease (the presence service's
// lease-end logout), its other entry stays, and the members elsewhere see the change. A member
// that closes cleanly loses its drop-on-leave entries too.
func TestDropOnLeaveWhenNodeKilled(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond // the lease is 3 intervals
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks, cfg.ServiceInstances, cfg.LeaseInterval = 2, 2, interval
	})
	doomed := join(t, c, 1, "doomed", "mics")
	quitter := join(t, c, 0, "quitter", "mics")
	stays := join(t, c, 0, "stays", "mics")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, o := range []struct {
		m    *member
		key  string
		drop bool
	}{
		{doomed, "doomed-mic", true}, {doomed, "doomed-note", false},
		{quitter, "quitter-mic", true}, {stays, "stays-mic", true},
	} {
		if _, err := o.m.QueueOffer(ctx, o.key, []byte("x"), sdk.OfferOptions{DropOnLeave: o.drop}); err != nil {
			t.Fatal(err)
		}
	}
	// A node reports its logins every 100 ms: a session it dies before reporting was never
	// online as far as presence knows, and gets no logout (docs/protocol.md).
	for _, p := range c.Presences {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if n := p.Sessions(); n != 3 {
				return fmt.Errorf("a presence instance knows %d sessions, want 3", n)
			}
			return nil
		})
	}
	quitter.Close()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got, _ := list(t, stays); !slices.Equal(got, []string{"doomed-mic", "doomed-note", "stays-mic"}) {
			return fmt.Errorf("after a clean leave the queue lists %v", got)
		}
		return nil
	})

	killed := time.Now()
	c.Nodes[1].Kill()
	want := []string{"doomed-note", "stays-mic"}
	testkit.CheckFor(t, 3*interval+3*time.Second, 10*time.Millisecond, func() error {
		if got, _ := list(t, stays); !slices.Equal(got, want) {
			return fmt.Errorf("after the node died the queue lists %v, want %v", got, want)
		}
		return nil
	})
	t.Logf("the killed node's member's entry left the queue %v after the kill (lease %v)", time.Since(killed).Round(time.Millisecond), 3*interval)
	_, version := list(t, stays)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return stays.agrees(want, version) })
	var dropped int64
	for _, q := range c.Queues {
		_, d := q.Stats()
		dropped += d
	}
	if dropped != 2 {
		t.Errorf("the queue instances dropped %d entries, want 2", dropped)
	}
}

// TestMemberPermissions checks the room's queue_expr, queue_admin_expr and queue_max_entries
// on members' requests.
func TestMemberPermissions(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	body := `{"room":"talk","settings":{"queue_expr":"\"speaker\" in tags","queue_admin_expr":"\"host\" in tags","queue_max_entries":2}}`
	req, _ := http.NewRequest("POST", c.URL()+"/v1/rooms", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", resp.StatusCode)
	}
	host := join(t, c, 0, "host", "talk", "host", "speaker")
	sp := join(t, c, 0, "sp", "talk", "speaker")
	viewer := join(t, c, 0, "viewer", "talk")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	forbidden := &sdk.QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)}
	offer := func(m *member, key string) error {
		_, err := m.QueueOffer(ctx, key, nil, sdk.OfferOptions{})
		return err
	}
	steps := []struct {
		what string
		err  error
		want error
	}{
		{"a viewer offers", offer(viewer, "v"), forbidden},
		{"a speaker offers", offer(sp, "sp"), nil},
		{"a viewer lists", func() error { _, _, err := viewer.QueueList(ctx); return err }(), nil},
		{"a viewer peeks", func() error { _, err := viewer.QueuePeek(ctx, ""); return err }(), nil},
		{"a speaker clears", func() error { _, err := sp.QueueClear(ctx); return err }(), forbidden},
		{"the host offers", offer(host, "h"), nil},
		{"a third offer", offer(host, "h2"), sdk.ErrQueueFull},
		{"a speaker takes the host's entry", func() error { _, err := sp.QueueRemove(ctx, "h"); return err }(), forbidden},
		{"a speaker replaces the host's entry", offer(sp, "h"), sdk.ErrQueueKeyExists},
		{"a speaker polls its own entry at the head", func() error { _, err := sp.QueuePoll(ctx, ""); return err }(), nil},
		{"a speaker polls the host's entry at the head", func() error { _, err := sp.QueuePoll(ctx, ""); return err }(), forbidden},
		{"the speaker offers again", offer(sp, "sp"), nil},
		{"the host takes the speaker's entry", func() error { _, err := host.QueueRemove(ctx, "sp"); return err }(), nil},
		{"the host clears", func() error { _, err := host.QueueClear(ctx); return err }(), nil},
		{"a poll of the empty queue", func() error { _, err := host.QueuePoll(ctx, ""); return err }(), sdk.ErrQueueNotFound},
		{"a bad key", offer(host, "a b"), &sdk.QueueError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST)}},
	}
	for _, s := range steps {
		if (s.want == nil) != (s.err == nil) || (s.want != nil && !errors.Is(s.err, s.want)) {
			t.Errorf("%s: %v, want %v", s.what, s.err, s.want)
		}
	}
	// Nobody else may broadcast what looks like a queue change.
	_, err = host.Send(ctx, sdk.Outgoing{Type: sdk.QueueEventType, Lane: clientpb.Lane_LANE_CRITICAL, Body: []byte("fake")})
	var se *sdk.SendError
	if !errors.As(err, &se) || se.Code != uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN) {
		t.Errorf("a member's send of type %s: %v, want FORBIDDEN", sdk.QueueEventType, err)
	}
}
