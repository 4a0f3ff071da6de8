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
