package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// historyBodies pages through a client's view of the room's history with q, following the
// cursors, and returns the bodies oldest first.
func historyBodies(ctx context.Context, cl *sdk.Client, q sdk.HistoryQuery, older bool) ([]string, error) {
	var all []string
	for range 50 {
		page, err := cl.History(ctx, q)
		if err != nil {
			return nil, err
		}
		var got []string
		for _, m := range page.GetMessages() {
			got = append(got, string(m.GetBody()))
		}
		if older {
			all = append(got, all...)
		} else {
			all = append(all, got...)
		}
		if page.GetNextCursor() == "" {
			return all, nil
		}
		q = sdk.HistoryQuery{Limit: q.Limit, Lane: q.Lane, Cursor: page.GetNextCursor()}
	}
	return nil, errors.New("paging did not end")
}

// TestClusterHistory: members page through their room's history from the Go SDK, each seeing
// only what its tags allow; messages sent to users are not room history; bad queries get
// HISTORY errors.
func TestClusterHistory(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	const room = "lecture"
	forEachTransport(t, func(t *testing.T, transport string) {
		room := room + "-" + transport
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dial := func(uid string, tags ...string) *sdk.Client {
			tok, err := c.Mint(uid, room, tags, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL(), Transport: transport})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cl.Close() })
			return cl
		}
		vip, plain := dial("vera", "vip"), dial("paul", "fan")
		var err error

		// 9 messages: from the app (every third only for vips) and from vera; a message to
		// users in between is not the room's.
		var all, forPaul []string
		for i := range 9 {
			body := strconv.Itoa(i)
			switch {
			case i%3 == 1:
				err = apiJSON(ctx, c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"body": body, "tag_expr": `"vip" in tags`}, nil)
			case i%3 == 2:
				_, err = vip.Send(ctx, sdk.Outgoing{Type: "chat", Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(body)})
			default:
				err = apiJSON(ctx, c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"body": body, "lane": "critical"}, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, body)
			if i%3 != 1 {
				forPaul = append(forPaul, body)
			}
		}
		if err := apiJSON(ctx, c, "POST", "/v1/users/messages", map[string]any{"uids": []string{"vera", "paul"}, "body": "direct"}, nil); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			got, err := historyBodies(ctx, vip, sdk.HistoryQuery{Limit: 2}, true)
			if err != nil {
				return err
			}
			if !slices.Equal(got, all) {
				return fmt.Errorf("vera pages %v, want %v", got, all)
			}
			return nil
		})
		got, err := historyBodies(ctx, plain, sdk.HistoryQuery{Limit: 2}, true)
		if err != nil || !slices.Equal(got, forPaul) {
			t.Errorf("paul pages %v (%v), want %v: not the vip messages", got, err, forPaul)
		}
		newest, err := plain.History(ctx, sdk.HistoryQuery{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		msgs := newest.GetMessages()
		got, err = historyBodies(ctx, plain, sdk.HistoryQuery{Limit: 2, AfterID: msgs[1].GetId()}, false)
		if err != nil || !slices.Equal(got, forPaul[2:]) {
			t.Errorf("paul pages after %s: %v (%v), want %v", msgs[1].GetId(), got, err, forPaul[2:])
		}
		got, err = historyBodies(ctx, plain, sdk.HistoryQuery{Lane: clientpb.Lane_LANE_CRITICAL}, true)
		if err != nil || !slices.Equal(got, []string{"0", "3", "6"}) {
			t.Errorf("critical lane: %v (%v)", got, err)
		}

		var refused *sdk.HistoryError
		_, err = plain.History(ctx, sdk.HistoryQuery{Cursor: "garbage"})
		if !errors.As(err, &refused) || refused.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_HISTORY_QUERY) || refused.Temporary() {
			t.Errorf("bad cursor: %v, want a HistoryError BAD_HISTORY_QUERY", err)
		}
		if _, err := plain.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("still up")}); err != nil {
			t.Errorf("send after a refused query: %v", err)
		}
	})
}

// TestClusterHistoryBusy: while the room service does not answer, a connection may have two
// history queries waiting; the third is refused with HISTORY_BUSY at once.
func TestClusterHistoryBusy(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl := dialCluster(t, c, "tcp", "ann", "busy", sdk.Config{})
	// The room service stops; a responder holds every history query instead.
	for _, r := range c.Rooms {
		r.Close()
	}
	held := make(chan *nats.Msg, 16)
	sub, err := nc.Subscribe(bus.SubjectRoomHistory, func(m *nats.Msg) { held <- m })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = nc.Flush()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = cl.History(ctx, sdk.HistoryQuery{}) }()
	}
	var waiting []*nats.Msg
	for range 2 {
		select {
		case m := <-held:
			waiting = append(waiting, m)
		case <-time.After(5 * time.Second):
			t.Fatal("the history queries did not reach the bus")
		}
	}
	qctx, qcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer qcancel()
	_, err = cl.History(qctx, sdk.HistoryQuery{})
	var refused *sdk.HistoryError
	if !errors.As(err, &refused) || refused.Code != uint32(clientpb.ErrorCode_ERROR_CODE_HISTORY_BUSY) || !refused.Temporary() {
		t.Errorf("third query: %v, want a HistoryError HISTORY_BUSY", err)
	}
	for _, m := range waiting {
		bus.Respond(slog.New(slog.DiscardHandler), m, &buspb.Reply{History: &clientpb.HistoryPage{}})
	}
	wg.Wait()
	cancel()
}

// TestClusterHistoryRetentionAtLogin: a room that keeps 3 messages replays 3 to a login that
// asks for 10 (Config.History), as its history API would page them.
func TestClusterHistoryRetentionAtLogin(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const room = "short"
	if err := apiJSON(ctx, c, "POST", "/v1/rooms", map[string]any{"room": room, "settings": map[string]any{"history_max_messages": 3}}, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := apiSend(ctx, c, room, strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"3", "4", "5"}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		got := make(chan string, 10)
		recovered := make(chan struct{})
		cl := dialCluster(t, c, "tcp", "late", room, sdk.Config{
			History:   10,
			OnMessage: func(m *clientpb.Message) { got <- string(m.GetBody()) },
			OnEvent: func(e sdk.Event) {
				if _, ok := e.(*sdk.RecoveredEvent); ok {
					close(recovered)
				}
			},
		})
		defer cl.Close()
		select {
		case <-recovered:
		case <-time.After(3 * time.Second):
			return errors.New("no RecoveredEvent")
		}
		close(got)
		var bodies []string
		for b := range got {
			bodies = append(bodies, b)
		}
		if !slices.Equal(bodies, want) {
			return fmt.Errorf("login history %v, want %v", bodies, want)
		}
		return nil
	})
}
