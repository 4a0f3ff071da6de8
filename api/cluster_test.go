package api_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// TestClusterPresenceAndRooms runs 2 ChatLinks and 2 instances of each service: counts and member
// lists are right across nodes, a ban holds on both nodes, the room service and presence recover
// their counts after a restart, and a ChatLink that dies without a goodbye leaves nothing behind
// once its lease runs out.
func TestClusterPresenceAndRooms(t *testing.T) {
	t.Parallel()
	const lease = 100 * time.Millisecond // the services drop a node after 3 silent leases
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks, cfg.ServiceInstances, cfg.LeaseInterval = 2, 2, lease
	})
	n1, n2 := c.Nodes[0].TCPAddr(), c.Nodes[1].TCPAddr()
	member(t, n1, "alice", "r1", "class:1")
	member(t, n2, "bob", "r1", "class:2")
	member(t, n1, "carol", "r1", "class:2", "role:assistant")
	member(t, n2, "dave", "r2")

	wantRoom := func(room string, online int, nodes map[string]int) func() error {
		return func() error {
			status, out := httpCall(t, c, "GET", "/v1/rooms/"+room, devcluster.APIKey, "")
			if online == 0 {
				if status != 404 {
					return fmt.Errorf("room %s: HTTP %d %v, want 404", room, status, out)
				}
				return nil
			}
			if status != 200 {
				return fmt.Errorf("room %s: HTTP %d %v", room, status, out)
			}
			got := map[string]int{}
			for k, v := range out["nodes"].(map[string]any) {
				got[k] = int(v.(float64))
			}
			if status != 200 || int(out["online"].(float64)) != online || fmt.Sprint(got) != fmt.Sprint(nodes) {
				return fmt.Errorf("room %s: HTTP %d %v, want online %d on %v", room, status, out, online, nodes)
			}
			return nil
		}
	}
	wantOnline := func(sessions int) func() error {
		return func() error {
			out := mustHTTP(t, c, 200, "GET", "/v1/online", "")
			if int(out["sessions"].(float64)) != sessions {
				return fmt.Errorf("online: %v, want %d sessions", out, sessions)
			}
			return nil
		}
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, wantRoom("r1", 3, map[string]int{"cl-1": 2, "cl-2": 1}))
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, wantRoom("r2", 1, map[string]int{"cl-2": 1}))
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, wantOnline(4))

	// Member lists page across the nodes, and filter by tag.
	var uids []string
	token := ""
	for page := 0; ; page++ {
		out := mustHTTP(t, c, 200, "GET", "/v1/rooms/r1/members?page_size=2&page_token="+token, "")
		for _, m := range out["members"].([]any) {
			uids = append(uids, m.(map[string]any)["uid"].(string))
		}
		token = out["next_page_token"].(string)
		if token == "" {
			break
		}
		if page > 3 {
			t.Fatal("member pages do not end")
		}
	}
	slices.Sort(uids)
	if fmt.Sprint(uids) != "[alice bob carol]" {
		t.Fatalf("members of r1: %v", uids)
	}
	out := mustHTTP(t, c, 200, "GET", "/v1/rooms/r1/members?tag=class:2", "")
	if got := out["members"].([]any); len(got) != 2 {
		t.Fatalf("members with class:2: %v", got)
	}
	out = mustHTTP(t, c, 200, "GET", "/v1/users/bob/sessions", "")
	if s := out["sessions"].([]any); !out["online"].(bool) || len(s) != 1 || s[0].(map[string]any)["node"] != "cl-2" {
		t.Fatalf("bob's sessions: %v", out)
	}

	// A banned user is refused on either node.
	mustHTTP(t, c, 200, "POST", "/v1/rooms/r1/members/eve/ban", `{"reason":"spam"}`)
	for _, addr := range []string{n1, n2} {
		tok, _ := c.Mint("eve", "r1", nil, time.Hour)
		expectRefused(t, testkit.DialTCP(t, addr), tok, clientpb.CloseCode_CLOSE_CODE_BANNED, "banned eve's login on "+addr)
	}

	// Restarted room service instances know the counts again within 5s.
	if err := c.RestartRooms(); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, wantRoom("r1", 3, map[string]int{"cl-1": 2, "cl-2": 1}))
	// ... and the ban, from JetStream.
	tok, _ := c.Mint("eve", "r1", nil, time.Hour)
	expectRefused(t, testkit.DialTCP(t, n2), tok, clientpb.CloseCode_CLOSE_CODE_BANNED, "after the restart, banned eve's login")
	// Restarted presence instances get the sessions again from the ChatLinks' snapshots.
	if err := c.RestartPresence(); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, wantOnline(4))
	for _, p := range c.Presences {
		testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			if n := p.Sessions(); n != 4 {
				return fmt.Errorf("a presence instance knows %d sessions, want 4", n)
			}
			return nil
		})
	}

	// Node 2 dies without a goodbye: within its lease its sessions and members are gone.
	killed := time.Now()
	c.Nodes[1].Kill()
	testkit.CheckFor(t, 3*lease+time.Second, 10*time.Millisecond, wantOnline(2))
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, wantRoom("r1", 2, map[string]int{"cl-1": 2}))
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, wantRoom("r2", 0, nil))
	// Each presence instance expires the lease on its own clock: ask until both have.
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		for range 4 {
			if out := mustHTTP(t, c, 200, "GET", "/v1/users/bob/sessions", ""); out["online"].(bool) {
				return fmt.Errorf("bob still online after his node died: %v", out)
			}
		}
		return nil
	})
	t.Logf("node 2's sessions gone %v after it died (lease %v x 3)", time.Since(killed).Round(time.Millisecond), lease)
}
