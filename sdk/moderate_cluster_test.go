package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// auditRecord is one "moderator action" record of the audit trail, as JSON.
type auditRecord struct {
	Msg       string `json:"msg"`
	Op        string `json:"op"`
	Room      string `json:"room"`
	UID       string `json:"uid"`
	Moderator string `json:"moderator"`
	Result    string `json:"result"`
	Node      string `json:"node"`
	MessageID string `json:"message_id"`
}

// moderatorActions returns the audit trail's moderator actions.
func moderatorActions(t *testing.T, trail *testkit.Buffer) []auditRecord {
	t.Helper()
	var out []auditRecord
	for line := range strings.SplitSeq(trail.String(), "\n") {
		var r auditRecord
		if line == "" || json.Unmarshal([]byte(line), &r) != nil || r.Msg != "moderator action" {
			continue
		}
		out = append(out, r)
	}
	return out
}

// TestModerators: in a super small class over two ChatLinks (a lecturer, two classes, an
// assistant each), an assistant mutes a member of their class, whose sends are then refused,
// and cannot mute a member of the other class nor the lecturer; unmute lets the member send
// again; a member who is no moderator is refused; the lecturer removes a member of any class;
// every action, applied or refused, is in the audit trail with the moderator's uid.
func TestModerators(t *testing.T) {
	t.Parallel()
	var trail testkit.Buffer
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.Audit = slog.New(slog.NewJSONHandler(&trail, nil))
	})
	const room = "class"
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"moderator_expr":"role == \"assistant\"","moderator_scope_prefix":"class:","moderator_room_expr":"role == \"lecturer\""}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	dial := func(node int, uid string, tags ...string) *sdk.Client {
		t.Helper()
		v := dialViewer(t, c.Nodes[node], uid, room, tags...)
		if v == nil {
			t.FailNow()
		}
		t.Cleanup(func() { v.cl.Close() })
		testcluster.WaitOnline(t, c, uid) // moderators act on members presence knows
		return v.cl
	}
	lecturer := dial(1, "lecturer", "role:lecturer")
	asst1 := dial(0, "asst1", "role:assistant", "class:1")
	dial(1, "asst2", "role:assistant", "class:2")
	s1 := dial(1, "s1", "class:1") // asst1's class, on the other ChatLink
	s2 := dial(0, "s2", "class:2")
	plain := dial(1, "plain", "class:1")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	send := func(cl *sdk.Client) error {
		_, err := cl.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("hi")})
		return err
	}
	forbidden := func(err error) bool {
		var se *sdk.SendError
		return errors.As(err, &se) && se.Code == uint32(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN)
	}

	// The room service learns the room's settings from its store as they change: the first
	// request may come before, and is then refused as from no moderator. Asked again no faster
	// than the connection's moderate rate refills (5 a second), so the retries leave the burst
	// for the requests below.
	testkit.CheckFor(t, 10*time.Second, 250*time.Millisecond, func() error {
		n, err := asst1.Mute(ctx, "s1", 0)
		if err != nil {
			return err
		}
		if n != 1 {
			t.Errorf("mute s1: %d sessions, want 1", n)
		}
		return nil
	})
	muted := time.Now()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if err := send(s1); !forbidden(err) {
			return fmt.Errorf("muted s1 sends: %v, want FORBIDDEN", err)
		}
		return nil
	})
	t.Logf("s1's send refused %v after the mute's answer", time.Since(muted))

	for _, tc := range []struct {
		name string
		do   func() (int64, error)
		want error
	}{
		{"assistant mutes a member of another class", func() (int64, error) { return asst1.Mute(ctx, "s2", time.Minute) }, sdk.ErrOutsideScope},
		{"assistant mutes the lecturer", func() (int64, error) { return asst1.Mute(ctx, "lecturer", 0) }, sdk.ErrOutsideScope},
		{"assistant removes a member of another class", func() (int64, error) { return asst1.Remove(ctx, "s2", "") }, sdk.ErrOutsideScope},
		{"a member who moderates nothing mutes", func() (int64, error) { return plain.Mute(ctx, "s1", 0) }, sdk.ErrNotModerator},
		{"a member who moderates nothing unmutes", func() (int64, error) { return s1.Unmute(ctx, "plain") }, sdk.ErrNotModerator},
		{"assistant mutes a member who is not in the room", func() (int64, error) { return asst1.Mute(ctx, "nobody", 0) }, sdk.ErrMemberNotFound},
	} {
		if _, err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	badRequest := &sdk.ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST)}
	if _, err := asst1.Mute(ctx, "bad uid", 0); !errors.Is(err, badRequest) || !strings.Contains(err.Error(), "uid") {
		t.Errorf("mute a malformed uid: %v, want BAD_REQUEST naming uid", err)
	}
	if _, err := asst1.Mute(ctx, "asst1", 0); !errors.Is(err, badRequest) {
		t.Errorf("a moderator mutes themselves: %v, want BAD_REQUEST", err)
	}
	if err := send(s2); err != nil {
		t.Errorf("s2, whom the refused mute named, sends: %v", err)
	}

	start := time.Now()
	if n, err := asst1.Unmute(ctx, "s1"); err != nil || n != 1 {
		t.Fatalf("unmute s1: %d, %v", n, err)
	}
	t.Logf("unmute across ChatLinks answered in %v", time.Since(start))
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		return send(s1)
	})

	// The lecturer acts on every class: removes s2 (of class 2, on the other ChatLink).
	start = time.Now()
	if n, err := lecturer.Remove(ctx, "s2", "off topic"); err != nil || n != 1 {
		t.Fatalf("lecturer removes s2: %d, %v", n, err)
	}
	t.Logf("remove across ChatLinks answered in %v", time.Since(start))
	select {
	case <-s2.Done():
	case <-ctx.Done():
		t.Fatal("s2 still connected after its removal")
	}
	var ce *sdk.CloseError
	if err := s2.Err(); !errors.As(err, &ce) || ce.Code != uint32(clientpb.CloseCode_CLOSE_CODE_KICKED) || ce.Reason != "off topic" {
		t.Errorf("s2 closed with %v, want 4007 KICKED with the lecturer's reason", err)
	}
	if n, err := lecturer.Mute(ctx, "s1", time.Hour); err != nil || n != 1 {
		t.Errorf("lecturer mutes s1 (class 1): %d, %v", n, err)
	}

	want := []auditRecord{
		{Op: "mute", UID: "s1", Moderator: "asst1", Result: "OK"},
		{Op: "mute", UID: "s2", Moderator: "asst1", Result: "OUTSIDE_SCOPE"},
		{Op: "mute", UID: "s1", Moderator: "plain", Result: "NOT_MODERATOR"},
		{Op: "unmute", UID: "s1", Moderator: "asst1", Result: "OK"},
		{Op: "remove", UID: "s2", Moderator: "lecturer", Result: "OK"},
		{Op: "mute", UID: "s1", Moderator: "lecturer", Result: "OK"},
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		got := moderatorActions(t, &trail)
		for _, w := range want {
			found := false
			for _, r := range got {
				if r.Op == w.Op && r.UID == w.UID && r.Moderator == w.Moderator && r.Result == w.Result && r.Room == room && r.Node != "" {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("audit trail lacks %+v; has %+v", w, got)
			}
		}
		return nil
	})
}

// TestModeratorRecall: in a super small class over two ChatLinks, an assistant recalls a
// message of a member of their class (every member hears of it, naming the assistant, and
// history leaves it out), but not one of a member of another class nor one of the app server
// (141), nor one whose sender has left the room (107); the lecturer recalls any; a malformed or
// unknown id is refused (100, 130); the audit trail names the messages.
func TestModeratorRecall(t *testing.T) {
	t.Parallel()
	var trail testkit.Buffer
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.Audit = slog.New(slog.NewJSONHandler(&trail, nil))
	})
	const room = "recallclass"
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"moderator_expr":"role == \"assistant\"","moderator_scope_prefix":"class:","moderator_room_expr":"role == \"lecturer\""}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	dial := func(node int, uid string, tags ...string) *recaller {
		t.Helper()
		r := dialRecaller(t, c.Nodes[node], uid, room, sdk.Config{}, tags...)
		testcluster.WaitOnline(t, c, uid) // moderators act on members presence knows
		return r
	}
	lecturer := dial(1, "lecturer", "role:lecturer")
	asst1 := dial(0, "asst1", "role:assistant", "class:1")
	s1 := dial(1, "s1", "class:1") // asst1's class, on the other ChatLink
	s2 := dial(0, "s2", "class:2")
	leaver := dial(1, "leaver", "class:1")
	members := []*recaller{lecturer, asst1, s1, s2}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	send := func(r *recaller, body string) string {
		t.Helper()
		ack, err := r.cl.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte(body)})
		if err != nil {
			t.Fatalf("send %s: %v", body, err)
		}
		return ack.GetMessageId()
	}
	m1, m2, mLeaver := send(s1, "of class 1"), send(s2, "of class 2"), send(leaver, "of one who leaves")
	var notice struct {
		ID string `json:"id"`
	}
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages", devcluster.APIKey,
		`{"type":"notice","lane":"critical","body":"from the app"}`, &notice); code != http.StatusOK || notice.ID == "" {
		t.Fatalf("app server's send: HTTP %d", code)
	}
	// The room service learns the room's settings from its store as they change: until then
	// the assistant is no moderator. Asked again no faster than the connection's moderate rate
	// refills (5 a second), so the retries leave the burst for the requests below.
	start := time.Now()
	testkit.CheckFor(t, 10*time.Second, 250*time.Millisecond, func() error {
		return asst1.cl.RecallAsModerator(ctx, m1)
	})
	t.Logf("an assistant's recall across ChatLinks answered in %v", time.Since(start))
	heard := func(id, by string) {
		t.Helper()
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			for _, m := range members {
				if m.recalls(id) != 1 || m.recalledBy(id) != by {
					return fmt.Errorf("a member heard of the recall of %s %d times, by %q; want once, by %s", id, m.recalls(id), m.recalledBy(id), by)
				}
			}
			return nil
		})
	}
	heard(m1, "asst1")

	leaver.cl.Close()
	notFound := &sdk.ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND)}
	badRequest := &sdk.ModerateError{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST)}
	for _, tc := range []struct {
		name string
		cl   *sdk.Client
		id   string
		want error
	}{
		{"assistant recalls a message of another class", asst1.cl, m2, sdk.ErrOutsideScope},
		{"assistant recalls the app server's message", asst1.cl, notice.ID, sdk.ErrOutsideScope},
		{"a member who moderates nothing recalls", s2.cl, m2, sdk.ErrNotModerator},
		{"assistant recalls a malformed id", asst1.cl, "not-an-id", badRequest},
		{"assistant recalls an id the room never had", asst1.cl, "01ARZ3NDEKTSV4RRFFQ69G5FAV", notFound},
	} {
		if err := tc.cl.RecallAsModerator(ctx, tc.id); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The leaver's sessions leave presence a moment after its close.
	testkit.CheckFor(t, 10*time.Second, 250*time.Millisecond, func() error {
		if err := asst1.cl.RecallAsModerator(ctx, mLeaver); !errors.Is(err, sdk.ErrMemberNotFound) {
			return fmt.Errorf("assistant recalls the message of a member who left: %v, want USER_NOT_FOUND", err)
		}
		return nil
	})

	// The lecturer recalls any message: of class 2, and the app server's.
	for _, id := range []string{m2, notice.ID} {
		if err := lecturer.cl.RecallAsModerator(ctx, id); err != nil {
			t.Fatalf("lecturer recalls %s: %v", id, err)
		}
		heard(id, "lecturer")
	}
	if err := asst1.cl.RecallAsModerator(ctx, m1); err != nil {
		t.Errorf("assistant recalls m1 again: %v, want no error", err)
	}

	var page struct {
		Messages []struct {
			ID string `json:"id"`
		} `json:"messages"`
	}
	if code := testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/history", devcluster.APIKey, "", &page); code != http.StatusOK {
		t.Fatalf("history: HTTP %d", code)
	}
	var kept []string
	for _, m := range page.Messages {
		kept = append(kept, m.ID)
	}
	if want := []string{mLeaver}; !slices.Equal(kept, want) {
		t.Errorf("history %v, want only %v (the others recalled)", kept, want)
	}

	want := []auditRecord{
		{Op: "recall", MessageID: m1, Moderator: "asst1", Result: "OK"},
		{Op: "recall", MessageID: m2, Moderator: "asst1", Result: "OUTSIDE_SCOPE"},
		{Op: "recall", MessageID: notice.ID, Moderator: "asst1", Result: "OUTSIDE_SCOPE"},
		{Op: "recall", MessageID: m2, Moderator: "s2", Result: "NOT_MODERATOR"},
		{Op: "recall", MessageID: mLeaver, Moderator: "asst1", Result: "USER_NOT_FOUND"},
		{Op: "recall", MessageID: m2, Moderator: "lecturer", Result: "OK"},
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		got := moderatorActions(t, &trail)
		for _, w := range want {
			if !slices.ContainsFunc(got, func(r auditRecord) bool {
				return r.Op == w.Op && r.MessageID == w.MessageID && r.Moderator == w.Moderator && r.Result == w.Result && r.Room == room && r.Node != ""
			}) {
				return fmt.Errorf("audit trail lacks %+v; has %+v", w, got)
			}
		}
		return nil
	})
}
