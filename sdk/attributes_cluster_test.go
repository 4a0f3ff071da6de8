package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
)

// waitAttributes waits until every viewer's room attributes are want.
func waitAttributes(t *testing.T, vs []*viewer, want map[string]string) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		for i, v := range vs {
			if got, _ := v.cl.Attributes(); !maps.Equal(got, want) {
				return fmt.Errorf("viewer %d has %v, want %v", i, got, want)
			}
		}
		return nil
	})
}

// TestRoomAttributes: a pinned message set through the API reaches the members online on two
// ChatLinks, and later logins on either; a change and a removal reach them too; a value, a
// count or a key past the limits is refused with a clear error, and the set stays as it was.
func TestRoomAttributes(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	const room = "stage"
	put := func(key, body string) int {
		t.Helper()
		return testcluster.Call(t, c, http.MethodPut, "/v1/rooms/"+room+"/attributes/"+key, devcluster.APIKey, body, nil)
	}
	var vs []*viewer
	for i := range 4 {
		v := dialViewer(t, c.Nodes[i%2], fmt.Sprintf("u%d", i), room)
		if v == nil {
			return
		}
		t.Cleanup(func() { v.cl.Close() })
		vs = append(vs, v)
	}
	if code := put("pinned", `{"value":"welcome to the show"}`); code != http.StatusOK {
		t.Fatalf("PUT pinned: HTTP %d", code)
	}
	if code := put("announcement", `{"value":"starts at 8"}`); code != http.StatusOK {
		t.Fatalf("PUT announcement: HTTP %d", code)
	}
	want := map[string]string{"pinned": "welcome to the show", "announcement": "starts at 8"}
	waitAttributes(t, vs, want)

	// Later logins, on both ChatLinks (the second's first of the room, and not).
	for i := range 2 {
		v := dialViewer(t, c.Nodes[i], fmt.Sprintf("late%d", i), room)
		if v == nil {
			return
		}
		t.Cleanup(func() { v.cl.Close() })
		vs = append(vs, v)
	}
	waitAttributes(t, vs, want)

	if code := put("announcement", `{"remove":true}`); code != http.StatusOK {
		t.Fatalf("remove announcement: HTTP %d", code)
	}
	delete(want, "announcement")
	waitAttributes(t, vs, want)

	var refusal struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if code := testcluster.Call(t, c, http.MethodPut, "/v1/rooms/"+room+"/attributes/big", devcluster.APIKey,
		`{"value":"`+strings.Repeat("x", 4097)+`"}`, &refusal); code != http.StatusConflict || refusal.Code != 125 {
		t.Errorf("a value of 4097 bytes: HTTP %d %+v, want 409 with code 125", code, refusal)
	}
	for i := range 15 {
		if code := put(fmt.Sprintf("k%d", i), `{"value":"v"}`); code != http.StatusOK {
			t.Fatalf("attribute %d: HTTP %d", i+2, code)
		}
		want[fmt.Sprintf("k%d", i)] = "v"
	}
	if code := put("one-too-many", `{"value":"v"}`); code != http.StatusConflict {
		t.Errorf("a 17th attribute: HTTP %d, want 409", code)
	}
	if code := put("bad%20key", `{"value":"v"}`); code != http.StatusBadRequest {
		t.Errorf("a key with a space: HTTP %d, want 400", code)
	}
	waitAttributes(t, vs, want)
	var got struct {
		Attributes []struct{ Key, Value string } `json:"attributes"`
	}
	if code := testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/attributes", devcluster.APIKey, "", &got); code != http.StatusOK || len(got.Attributes) != 16 {
		t.Errorf("GET attributes: HTTP %d, %d attributes, want 16", code, len(got.Attributes))
	}
}

// TestMemberAttributes: in a room whose attributes_expr names its hosts and whose attribute_keys
// name "pinned", a host on one ChatLink pins a message and every member, on both ChatLinks,
// sees it; a viewer is refused with ErrAttributesNotAllowed, the host is refused a key the room
// does not name and a value past the limits, and the set stays as the host left it; the host's
// removal reaches everyone. Each change, taken or refused, is in the audit trail; settings that
// name a bad expression, a bad key or too many keys are refused.
func TestMemberAttributes(t *testing.T) {
	t.Parallel()
	audit := &testkit.Buffer{}
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.Audit = slog.New(slog.NewJSONHandler(audit, nil))
	})
	const room = "podium"
	// Bad settings are refused, saying which.
	many := strings.Repeat(`"k",`, 16) + `"k"`
	for _, bad := range []struct {
		settings string
		code     int
		says     string
	}{
		{`{"attributes_expr":"tags ++"}`, 104, "attributes_expr"},
		{`{"attributes_expr":"true","attribute_keys":["bad key"]}`, 100, "attribute_keys"},
		{`{"attributes_expr":"true","attribute_keys":[` + many + `]}`, 100, "at most 16"},
	} {
		var refusal struct {
			Code  int    `json:"code"`
			Error string `json:"error"`
		}
		code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey, `{"room":"bad","settings":`+bad.settings+`}`, &refusal)
		if code != http.StatusBadRequest || refusal.Code != bad.code || !strings.Contains(refusal.Error, bad.says) {
			t.Errorf("settings %s: HTTP %d %+v, want 400 with code %d saying %q", bad.settings, code, refusal, bad.code, bad.says)
		}
	}
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"podium","settings":{"attributes_expr":"\"role:host\" in tags","attribute_keys":["pinned"]}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	host := dialViewer(t, c.Nodes[0], "host", room, "role:host")
	if host == nil {
		return
	}
	t.Cleanup(func() { host.cl.Close() })
	vs := []*viewer{host}
	for i := range 3 {
		v := dialViewer(t, c.Nodes[(i+1)%2], fmt.Sprintf("u%d", i), room)
		if v == nil {
			return
		}
		t.Cleanup(func() { v.cl.Close() })
		vs = append(vs, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	start := time.Now()
	version, err := host.cl.SetAttribute(ctx, "pinned", "Q&A at 9")
	if err != nil || version == 0 {
		t.Fatalf("host SetAttribute: version %d, %v", version, err)
	}
	answered := time.Since(start)
	want := map[string]string{"pinned": "Q&A at 9"}
	waitAttributes(t, vs, want)
	t.Logf("a member's pin: answered in %v, on every member of both ChatLinks within %v (polled every 10 ms)", answered, time.Since(start))
	if _, got := vs[2].cl.Attributes(); got != version {
		t.Errorf("a member on the other ChatLink has version %d, the host's change made %d", got, version)
	}

	// A viewer (on the second ChatLink) may not; the host may not set another key, nor too
	// long a value.
	viewer := vs[2]
	if _, err := viewer.cl.SetAttribute(ctx, "pinned", "mine now"); !errors.Is(err, sdk.ErrAttributesNotAllowed) {
		t.Errorf("a viewer's SetAttribute: %v, want ErrAttributesNotAllowed", err)
	}
	if _, err := viewer.cl.RemoveAttribute(ctx, "pinned"); !errors.Is(err, sdk.ErrAttributesNotAllowed) {
		t.Errorf("a viewer's RemoveAttribute: %v, want ErrAttributesNotAllowed", err)
	}
	if _, err := host.cl.SetAttribute(ctx, "announcement", "x"); !errors.Is(err, sdk.ErrAttributesNotAllowed) ||
		!strings.Contains(err.Error(), "attribute_keys") {
		t.Errorf("the host's SetAttribute of a key the room does not name: %v, want ErrAttributesNotAllowed naming attribute_keys", err)
	}
	if _, err := host.cl.SetAttribute(ctx, "pinned", strings.Repeat("x", 4097)); !errors.Is(err, sdk.ErrAttributesFull) {
		t.Errorf("the host's SetAttribute of 4097 bytes: %v, want ErrAttributesFull", err)
	}
	// Nothing the refusals tried reached anyone: the API reads the set as the host left it.
	var got struct {
		Attributes []struct{ Key, Value string } `json:"attributes"`
		Version    any                           `json:"version"`
	}
	if code := testcluster.Call(t, c, http.MethodGet, "/v1/rooms/"+room+"/attributes", devcluster.APIKey, "", &got); code != http.StatusOK ||
		len(got.Attributes) != 1 || got.Attributes[0].Value != "Q&A at 9" || fmt.Sprint(got.Version) != fmt.Sprint(version) {
		t.Errorf("GET attributes after the refusals: HTTP %d %+v, want the host's pin at version %d", code, got, version)
	}

	if _, err := host.cl.RemoveAttribute(ctx, "pinned"); err != nil {
		t.Fatalf("host RemoveAttribute: %v", err)
	}
	waitAttributes(t, vs, map[string]string{})

	log := audit.String()
	for _, want := range []string{
		`"msg":"member call","node":"` + c.Nodes[0].Name() + `","audit":true,"method":"SetAttribute","app":"demo","room":"podium","uid":"host"`,
		`"key":"pinned","remove":true,"result":"OK"`,
		`"uid":"u1","session":`,
		`"result":"ATTRIBUTES_NOT_ALLOWED"`,
		`"result":"ATTRIBUTES_FULL"`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("audit trail has no %s:\n%s", want, log)
		}
	}
}
