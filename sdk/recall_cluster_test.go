package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// recaller is a member that keeps what its Client handed over: messages and recalls, by id.
type recaller struct {
	cl       *sdk.Client
	mu       sync.Mutex
	got      []string // message ids, in the order handed over
	recalled map[string]int
	heardAt  map[string]time.Time // when each recall was first heard
	by       map[string]string    // who recalled each message, as the first recall heard says
}

func (r *recaller) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.got, id)
}

func (r *recaller) recalls(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recalled[id]
}

func (r *recaller) recalledBy(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[id]
}

// dialRecaller logs uid in to room on node with cfg's history choices and the tags given.
func dialRecaller(t *testing.T, node *chatlink.Node, uid, room string, cfg sdk.Config, tags ...string) *recaller {
	t.Helper()
	r := &recaller{recalled: map[string]int{}, heardAt: map[string]time.Time{}, by: map[string]string{}}
	cfg.Token = testcluster.Token(t, uid, room, tags...)
	cfg.Endpoints = []sdk.Endpoint{{Node: node.Name(), WSURL: node.WSURL(), TCPAddr: node.TCPAddr()}}
	cfg.Transport = sdk.TransportTCP
	cfg.OnMessage = func(m *clientpb.Message) {
		r.mu.Lock()
		r.got = append(r.got, m.GetId())
		r.mu.Unlock()
	}
	cfg.OnEvent = func(e sdk.Event) {
		if ev, ok := e.(*sdk.RecalledEvent); ok {
			r.mu.Lock()
			r.recalled[ev.ID]++
			if _, ok := r.heardAt[ev.ID]; !ok {
				r.heardAt[ev.ID] = time.Now()
				r.by[ev.ID] = ev.ByUID
			}
			r.mu.Unlock()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", uid, err)
	}
	r.cl = cl
	t.Cleanup(func() { cl.Close() })
	return r
}

// recallAnswer is the HTTP API's answer to a recall, or its refusal.
type recallAnswer struct {
	MessageID       string `json:"message_id"`
	RecalledMs      int64  `json:"recalled_ms"`
	AlreadyRecalled bool   `json:"already_recalled"`
	Code            int    `json:"code"`
}

func recallByAPI(t *testing.T, c *devcluster.Cluster, room, id, body string) (int, recallAnswer) {
	t.Helper()
	var a recallAnswer
	code := testcluster.Call(t, c, http.MethodDelete, "/v1/rooms/"+room+"/messages/"+id, devcluster.APIKey, body, &a)
	return code, a
}

// TestRecall: on two ChatLinks, a message the app server recalls reaches every member as a
// RecalledEvent, leaves the room's history pages, login history and recovery; a second recall
// answers already_recalled; an unknown or malformed id is refused with its code. A member
// recalls its own message within the room's window, not another's, and not in a room that
// does not allow it.
func TestRecall(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	const room, closed, short = "recall", "norecall", "quick"
	for name, window := range map[string]int{room: 60, closed: 0, short: 1} {
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
			fmt.Sprintf(`{"room":%q,"settings":{"sender_recall_window_s":%d}}`, name, window), nil); code != http.StatusCreated {
			t.Fatalf("create %s: HTTP %d", name, code)
		}
	}
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"toolong","settings":{"sender_recall_window_s":3601}}`, nil); code != http.StatusBadRequest {
		t.Errorf("a recall window of 3601 s: HTTP %d, want 400", code)
	}
	members := []*recaller{
		dialRecaller(t, c.Nodes[0], "alice", room, sdk.Config{}),
		dialRecaller(t, c.Nodes[1], "bob", room, sdk.Config{}),
	}
	send := func(body string) string {
		t.Helper()
		var out struct {
			ID string `json:"id"`
		}
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages", devcluster.APIKey,
			`{"type":"notice","lane":"critical","body":"`+body+`"}`, &out); code != http.StatusOK || out.ID == "" {
			t.Fatalf("send %s: HTTP %d", body, code)
		}
		return out.ID
	}
	// Critical, so that no budget thins a burst of them.
	ids := []string{send("m0"), send("m1"), send("m2"), send("m3")}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for i, m := range members {
			for _, id := range ids {
				if !m.has(id) {
					m.mu.Lock()
					defer m.mu.Unlock()
					return fmt.Errorf("member %d lacks %s of %v (has %v)", i, id, ids, m.got)
				}
			}
		}
		return nil
	})

	// The app server recalls m2: every member hears of it once.
	gone := ids[2]
	if code, a := recallByAPI(t, c, room, gone, ""); code != http.StatusOK || a.AlreadyRecalled || a.MessageID != gone {
		t.Fatalf("recall: HTTP %d %+v", code, a)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for i, m := range members {
			if m.recalls(gone) != 1 {
				return fmt.Errorf("member %d heard of the recall %d times", i, m.recalls(gone))
			}
		}
		return nil
	})
	// Again: the same answer, marked; members are told again and their Clients say nothing new.
	if code, a := recallByAPI(t, c, room, gone, ""); code != http.StatusOK || !a.AlreadyRecalled {
		t.Errorf("second recall: HTTP %d %+v, want 200 already_recalled", code, a)
	}

	// History pages leave it out.
	var page struct {
		Messages []struct {
			ID string `json:"id"`
		} `json:"messages"`
	}
	if code := testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/history", devcluster.APIKey, "", &page); code != http.StatusOK {
		t.Fatalf("history: HTTP %d", code)
	}
	var paged []string
	for _, m := range page.Messages {
		paged = append(paged, m.ID)
	}
	if want := []string{ids[0], ids[1], ids[3]}; !slices.Equal(paged, want) {
		t.Errorf("history page %v, want %v", paged, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	memberPage, err := members[1].cl.History(ctx, sdk.HistoryQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range memberPage.GetMessages() {
		if m.GetId() == gone {
			t.Errorf("a member's history page holds the recalled message")
		}
	}

	// Later logins on either ChatLink: login history and a recovery from m0 leave it out.
	late := []*recaller{
		dialRecaller(t, c.Nodes[0], "carol", room, sdk.Config{History: 10}),
		dialRecaller(t, c.Nodes[1], "dave", room, sdk.Config{RecoverSince: ids[0]}),
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for i, m := range late {
			if !m.has(ids[1]) || !m.has(ids[3]) {
				return fmt.Errorf("late member %d lacks the kept messages", i)
			}
		}
		return nil
	})
	for i, m := range late {
		if m.has(gone) {
			t.Errorf("late member %d was handed the recalled message", i)
		}
	}

	// Bad ids.
	if code, a := recallByAPI(t, c, room, "not-an-id", ""); code != http.StatusBadRequest || a.Code != 100 {
		t.Errorf("a malformed id: HTTP %d %+v, want 400 code 100", code, a)
	}
	unknown := ids[3][:len(ids[3])-1] + "Z"
	if unknown == ids[3] {
		unknown = ids[3][:len(ids[3])-1] + "Y"
	}
	if code, a := recallByAPI(t, c, room, unknown, ""); code != http.StatusNotFound || a.Code != 130 {
		t.Errorf("an unknown id: HTTP %d %+v, want 404 code 130", code, a)
	}

	// A member recalls its own message; not another's.
	ack, err := members[0].cl.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("oops")})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !members[1].has(ack.GetMessageId()) {
			return errors.New("bob lacks alice's message")
		}
		return nil
	})
	if _, err := members[1].cl.Recall(ctx, ack.GetMessageId()); !errors.Is(err, sdk.ErrRecallNotAllowed) {
		t.Errorf("bob recalls alice's message: %v, want ErrRecallNotAllowed", err)
	}
	if already, err := members[0].cl.Recall(ctx, ack.GetMessageId()); err != nil || already {
		t.Fatalf("alice recalls her message: already %v, %v", already, err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if members[1].recalls(ack.GetMessageId()) != 1 {
			return errors.New("bob did not hear of alice's recall")
		}
		return nil
	})
	// Recalled, it is still not bob's to recall (the stored recall is not sent again in his
	// name); alice's second recall is answered as already made.
	if _, err := members[1].cl.Recall(ctx, ack.GetMessageId()); !errors.Is(err, sdk.ErrRecallNotAllowed) {
		t.Errorf("bob recalls alice's recalled message: %v, want ErrRecallNotAllowed", err)
	}
	if already, err := members[0].cl.Recall(ctx, ack.GetMessageId()); err != nil || !already {
		t.Errorf("alice recalls her message again: already %v, %v; want already", already, err)
	}
	if _, err := members[0].cl.Recall(ctx, unknown); !errors.Is(err, sdk.ErrMessageNotFound) {
		t.Errorf("alice recalls an unknown id: %v, want ErrMessageNotFound", err)
	}
	if _, err := members[0].cl.Recall(ctx, "not-an-id"); !errors.Is(err, &sdk.SendError{Code: 100}) {
		t.Errorf("alice recalls a malformed id: %v, want code 100", err)
	}
	// A bulk message is not kept: a member cannot recall it.
	ack, err = members[0].cl.Send(ctx, sdk.Outgoing{Type: "danmaku", Lane: clientpb.Lane_LANE_BULK, Body: []byte("whee")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := members[0].cl.Recall(ctx, ack.GetMessageId()); !errors.Is(err, sdk.ErrMessageNotFound) {
		t.Errorf("alice recalls her bulk message: %v, want ErrMessageNotFound", err)
	}

	// The second recall of m2 reached the members long ago: told once.
	for i, m := range members {
		if n := m.recalls(gone); n != 1 {
			t.Errorf("member %d heard of m2's recall %d times", i, n)
		}
	}

	// A room that does not allow members to recall.
	other := dialRecaller(t, c.Nodes[1], "erin", closed, sdk.Config{})
	ack, err = other.cl.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("stays")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.cl.Recall(ctx, ack.GetMessageId()); !errors.Is(err, sdk.ErrRecallNotAllowed) {
		t.Errorf("a recall in a room without a window: %v, want ErrRecallNotAllowed", err)
	}

	// A room with a window of 1 s: a recall after it.
	hasty := dialRecaller(t, c.Nodes[0], "fay", short, sdk.Config{})
	ack, err = hasty.cl.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("too late")})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the window is the room's setting: nothing to wait on
	if _, err := hasty.cl.Recall(ctx, ack.GetMessageId()); !errors.Is(err, sdk.ErrRecallWindowPassed) {
		t.Errorf("a recall after the room's window: %v, want ErrRecallWindowPassed", err)
	}
}

// TestRecallCDN: in a room in CDN mode on two ChatLinks, a bulk danmaku recalled by the server
// API (unkept) right after it was sent reaches every member as a RecalledEvent within one
// window (1 s), and none hands it to the app, although its segment brings it (counted as a
// duplicate); members that log in just after the recall, on a ChatLink that heard it and on a
// third that held nobody of the room then, are told of it too and never show it.
func TestRecallCDN(t *testing.T) {
	t.Parallel()
	const (
		room   = "danmaku-wall"
		window = time.Second // the dev cluster's
	)
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks = 3
		cfg.CDN.Tick = 50 * time.Millisecond
	})
	if code := testcluster.Call(t, c, http.MethodPut, "/v1/rooms/"+room+"/cdn", devcluster.APIKey, `{"mode":"CDN_MODE_BULK"}`, nil); code != http.StatusOK {
		t.Fatalf("CDN mode: HTTP %d", code)
	}
	dial := func(i int, uid string) *recaller {
		var r *recaller
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			r = dialRecaller(t, c.Nodes[i], uid, room, sdk.Config{})
			if m := r.cl.LoginAck().GetCdn().GetMode(); m != clientpb.CdnMode_CDN_MODE_BULK {
				r.cl.Close()
				return fmt.Errorf("%s: LoginAck's CDN mode %v", uid, m)
			}
			return nil
		})
		return r
	}
	members := []*recaller{dial(0, "ann"), dial(1, "ben")}
	bulk := func(bodies ...string) []string {
		t.Helper()
		msgs := ""
		for i, b := range bodies {
			if i > 0 {
				msgs += ","
			}
			msgs += `{"lane":"bulk","type":"danmaku","body":"` + b + `"}`
		}
		var out struct {
			IDs []string `json:"ids"`
		}
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages/batch", devcluster.APIKey, `{"messages":[`+msgs+`]}`, &out); code != http.StatusOK || len(out.IDs) != len(bodies) {
			t.Fatalf("send: HTTP %d, %d ids", code, len(out.IDs))
		}
		return out.IDs
	}
	// Once the room service sends the room's bulk lane to the pusher, members get probes from
	// segments only.
	testkit.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		bulk("probe")
		for i, m := range members {
			if m.cl.CDNStats().Messages == 0 {
				return fmt.Errorf("member %d has no message from a segment yet", i)
			}
		}
		return nil
	})

	ids := bulk("stays", "goes")
	keep, gone := ids[0], ids[1]
	code, a := recallByAPI(t, c, room, gone, `{"unkept":true}`)
	recalledAt := time.Now()
	if code != http.StatusOK || a.AlreadyRecalled {
		t.Fatalf("recall of a bulk message: HTTP %d %+v", code, a)
	}
	// After the recall: their first segment may hold the message. The third ChatLink's first
	// member of the room learns of it from the room service's answer to its join.
	members = append(members, dial(0, "cat"), dial(2, "dan"))
	after := bulk("after")[0]
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for i, m := range members {
			if !m.has(after) || (i < 2 && !m.has(keep)) {
				return fmt.Errorf("member %d lacks the messages sent around the recall", i)
			}
			if m.recalls(gone) != 1 {
				return fmt.Errorf("member %d heard of the recall %d times", i, m.recalls(gone))
			}
		}
		return nil
	})
	for i, m := range members {
		if m.has(gone) {
			t.Errorf("member %d was handed the recalled danmaku", i)
		}
		m.mu.Lock()
		heard := m.heardAt[gone].Sub(recalledAt)
		m.mu.Unlock()
		if i < 2 && heard > window {
			t.Errorf("member %d heard of the recall %v after it, more than a window", i, heard)
		}
		t.Logf("member %d: recall heard %v after the API answered; CDN stats %+v", i, heard.Round(time.Millisecond), m.cl.CDNStats())
	}
	// The first members' segment brought it (a segment is polled after its window ends): it
	// was dropped as a message already had.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		for i, m := range members[:2] {
			if m.cl.CDNStats().Duplicates == 0 {
				return fmt.Errorf("member %d's segments brought no copy of the recalled danmaku", i)
			}
		}
		return nil
	})
}
