package mobile_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk/mobile"
)

// TestModerate: through the mobile facade an assistant mutes and unmutes a member of their class,
// recalls their message (the member hears of it) and removes them (the member's client hears
// the kick); a member of another class (or its message) is a refusal
// with ErrorOutsideScope, and a member who moderates nothing gets ErrorNotModerator: results,
// not errors.
func TestModerate(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	const room = "class"
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"moderator_expr":"role == \"assistant\"","moderator_scope_prefix":"class:"}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	login := func(uid string, tags ...string) (*mobile.Client, *recorder) {
		t.Helper()
		cl, r := connectMember(t, c, uid, room, tags...)
		testcluster.WaitOnline(t, c, uid) // moderators act on members presence knows
		return cl, r
	}
	asst, _ := login("asst", "role:assistant", "class:1")
	s1, r1 := login("s1", "class:1")
	s2, _ := login("s2", "class:2")

	// The room service knows the room's settings a moment after their write: until then the
	// assistant is no moderator. Asked again no faster than the connection's moderate rate
	// refills (5 a second), so the retries leave the burst for the requests below.
	testkit.CheckFor(t, 10*time.Second, 250*time.Millisecond, func() error {
		res, err := asst.Mute("s1", 60_000)
		if err != nil {
			return err
		}
		if res.ErrorCode != 0 || res.Sessions != 1 {
			return &refusal{res}
		}
		return nil
	})
	for _, tc := range []struct {
		name string
		do   func() (*mobile.ModerateResult, error)
		want int32
	}{
		{"mute a member of another class", func() (*mobile.ModerateResult, error) { return asst.Mute("s2", 0) }, mobile.ErrorOutsideScope},
		{"a member who moderates nothing mutes", func() (*mobile.ModerateResult, error) { return s2.Mute("s1", 0) }, mobile.ErrorNotModerator},
		{"unmute s1", func() (*mobile.ModerateResult, error) { return asst.Unmute("s1") }, 0},
	} {
		res, err := tc.do()
		if err != nil || res.ErrorCode != tc.want {
			t.Errorf("%s: %+v, %v; want code %d", tc.name, res, err, tc.want)
		}
	}
	if _, err := asst.Mute("s1", -1); err == nil {
		t.Error("a negative duration: no error")
	}
	// The assistant recalls s1's message (s1 hears of it, naming the assistant), not s2's.
	sent := func(cl *mobile.Client) string {
		t.Helper()
		var id string
		// s1's unmute applies to its sends a moment after its answer.
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			res, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: []byte("hello")})
			if err != nil {
				return err
			}
			if res.ErrorCode != 0 {
				return fmt.Errorf("send refused: %d %s", res.ErrorCode, res.ErrorMessage)
			}
			id = res.MessageID
			return nil
		})
		return id
	}
	of1, of2 := sent(s1), sent(s2)
	if res, err := asst.RecallAsModerator(of1); err != nil || res.ErrorCode != 0 || res.Sessions != 1 {
		t.Fatalf("recall s1's message: %+v, %v", res, err)
	}
	recalled, _ := waitEvent(t, r1, 0, "recalled", kind(mobile.EventRecalled))
	if recalled.MessageID != of1 || recalled.ByUID != "asst" {
		t.Errorf("s1's recalled event: %+v, want %s by asst", recalled, of1)
	}
	if res, err := asst.RecallAsModerator(of2); err != nil || res.ErrorCode != mobile.ErrorOutsideScope {
		t.Errorf("recall s2's message: %+v, %v; want code %d", res, err, mobile.ErrorOutsideScope)
	}
	if res, err := asst.Remove("s1", "see you tomorrow"); err != nil || res.ErrorCode != 0 || res.Sessions != 1 {
		t.Fatalf("remove s1: %+v, %v", res, err)
	}
	kicked, _ := waitEvent(t, r1, 0, "kicked", kind(mobile.EventKicked))
	if kicked.Code != mobile.CloseKicked || kicked.Reason != "see you tomorrow" {
		t.Errorf("s1's kick: %+v, want 4007 with the assistant's reason", kicked)
	}
}

// connectMember logs uid in to room with tags through the mobile facade and waits for it to be
// connected.
func connectMember(t *testing.T, c *devcluster.Cluster, uid, room string, tags ...string) (*mobile.Client, *recorder) {
	t.Helper()
	tok, err := c.Mint(uid, room, tags, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var r recorder
	cl, err := mobile.NewClient(&mobile.Config{Token: tok, Dispatcher: c.URL()}, &r)
	if err != nil {
		t.Fatalf("NewClient %s: %v", uid, err)
	}
	t.Cleanup(cl.Close)
	waitEvent(t, &r, 0, "connected", kind(mobile.EventConnected))
	return cl, &r
}

// refusal is a moderate result that was not the one awaited, as an error for CheckFor.
type refusal struct{ res *mobile.ModerateResult }

func (r *refusal) Error() string {
	return "moderate result " + r.res.ErrorMessage
}

// TestSenderRecall: through the mobile facade a member recalls its own message in a room whose
// settings allow it (every member, the sender included, gets EventRecalled), a second recall is
// AlreadyRecalled, another member's recall of it and any recall in a room without the window
// are results with their codes, not errors.
func TestSenderRecall(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	for room, settings := range map[string]string{"open": `{"sender_recall_window_s":60}`, "strict": `{}`} {
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
			`{"room":"`+room+`","settings":`+settings+`}`, nil); code != http.StatusCreated {
			t.Fatalf("create room %s: HTTP %d", room, code)
		}
	}
	send := func(cl *mobile.Client) string {
		t.Helper()
		res, err := cl.Send(&mobile.Outgoing{Type: "chat", Body: []byte("oops")})
		if err != nil || res.ErrorCode != 0 {
			t.Fatalf("send: %+v, %v", res, err)
		}
		return res.MessageID
	}
	sender, rs := connectMember(t, c, "sender", "open")
	other, ro := connectMember(t, c, "other", "open")
	id := send(sender)
	if res, err := other.Recall(id); err != nil || res.ErrorCode != mobile.ErrorRecallNotAllowed {
		t.Errorf("another member's recall: %+v, %v; want code %d", res, err, mobile.ErrorRecallNotAllowed)
	}
	// The room service knows the room's settings a moment after their write.
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		res, err := sender.Recall(id)
		if err != nil {
			return err
		}
		if res.ErrorCode != 0 || res.AlreadyRecalled {
			return fmt.Errorf("recall: %+v", res)
		}
		return nil
	})
	for name, r := range map[string]*recorder{"sender": rs, "other": ro} {
		if e, _ := waitEvent(t, r, 0, "recalled", kind(mobile.EventRecalled)); e.MessageID != id || e.ByUID != "sender" {
			t.Errorf("%s's recalled event: %+v, want %s by sender", name, e, id)
		}
	}
	if res, err := sender.Recall(id); err != nil || res.ErrorCode != 0 || !res.AlreadyRecalled {
		t.Errorf("a second recall: %+v, %v; want AlreadyRecalled", res, err)
	}

	strict, _ := connectMember(t, c, "strict", "strict")
	if res, err := strict.Recall(send(strict)); err != nil || res.ErrorCode != mobile.ErrorRecallNotAllowed {
		t.Errorf("a recall in a room without the window: %+v, %v; want code %d", res, err, mobile.ErrorRecallNotAllowed)
	}
}
