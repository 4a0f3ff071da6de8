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

// TestLiveState: a mobile client reads the room's viewer count (itself and another member) and
// a pinned message the app server set through the API.
func TestLiveState(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.ViewerInterval = 100 * time.Millisecond
	})
	cl := newClient(t, c, "alice", "stage", mobile.Config{}, nil)
	newClient(t, c, "bob", "stage", mobile.Config{}, nil)
	if code := testcluster.Call(t, c, http.MethodPut, "/v1/rooms/stage/attributes/pinned", devcluster.APIKey, `{"value":"welcome"}`, nil); code != http.StatusOK {
		t.Fatalf("PUT pinned: HTTP %d", code)
	}
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		a := cl.Attributes()
		if online := cl.ViewersOnline(); online != 2 || a.Get("pinned") != "welcome" || a.Len() != 1 || a.Version() == 0 {
			return fmt.Errorf("%d online, pinned %q (%d attributes, version %d); want 2 and \"welcome\"", online, a.Get("pinned"), a.Len(), a.Version())
		}
		return nil
	})
}

// TestSetAttribute: in a room whose attributes_expr names alice, her mobile client pins a
// message that bob's reads; bob's own change is refused with ErrorAttributesNotAllowed, as a
// result, not an error.
func TestSetAttribute(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"pins","settings":{"attributes_expr":"uid == \"alice\""}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	alice := newClient(t, c, "alice", "pins", mobile.Config{}, nil)
	bob := newClient(t, c, "bob", "pins", mobile.Config{}, nil)
	r, err := alice.SetAttribute("pinned", "hello")
	if err != nil || r.ErrorCode != 0 || r.Version == 0 {
		t.Fatalf("alice's SetAttribute: %+v, %v", r, err)
	}
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if a := bob.Attributes(); a.Get("pinned") != "hello" || a.Version() != r.Version {
			return fmt.Errorf("bob reads pinned %q at version %d, want \"hello\" at %d", a.Get("pinned"), a.Version(), r.Version)
		}
		return nil
	})
	r, err = bob.RemoveAttribute("pinned")
	if err != nil || r.ErrorCode != mobile.ErrorAttributesNotAllowed || r.ErrorMessage == "" {
		t.Errorf("bob's RemoveAttribute: %+v, %v; want a result with ErrorAttributesNotAllowed", r, err)
	}
}
