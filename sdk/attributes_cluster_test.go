package sdk_test

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
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
