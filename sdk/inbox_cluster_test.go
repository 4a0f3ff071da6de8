package sdk_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// sendAtLeastOnce sends an at-least-once message with body to uid through the server API.
func sendAtLeastOnce(t *testing.T, c *devcluster.Cluster, uid, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rep struct{ Id string }
	if err := apiJSON(ctx, c, http.MethodPost, "/v1/users/messages", map[string]any{
		"uids": []string{uid}, "type": "notice", "lane": "critical", "body": body, "at_least_once": true,
	}, &rep); err != nil || rep.Id == "" {
		t.Fatalf("send %q to %s: %v (id %q)", body, uid, err, rep.Id)
	}
}

// waitStoredEmpty waits until uid has nothing stored: every message was acknowledged.
func waitStoredEmpty(t *testing.T, c *devcluster.Cluster, uid string) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := len(testcluster.Stored(t, c, uid)); n > 0 {
			return fmt.Errorf("%d still stored for %s", n, uid)
		}
		return nil
	})
}

// waitBodies waits until r has at least n messages and returns their bodies.
func waitBodies(t *testing.T, r *recorder, n int, within time.Duration) []string {
	t.Helper()
	testkit.CheckFor(t, within, 10*time.Millisecond, func() error {
		if got := len(r.bodies()); got < n {
			return fmt.Errorf("%d of %d messages", got, n)
		}
		return nil
	})
	return r.bodies()
}

// TestClusterInboxOfflineUser: at-least-once messages sent to a user who is offline, some
// before and some after a restart of the services role (on the same JetStream), all reach the
// app at its next login, exactly once, and are acknowledged; the login after that gets none
// of them. The user stays offline for a minute (2 s under -short: nothing in the path depends
// on how long, the messages' expiry is the default 24 h).
func TestClusterInboxOfflineUser(t *testing.T) {
	t.Parallel()
	offline := time.Minute
	if testing.Short() {
		offline = 2 * time.Second
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("before-%d", i))
		sendAtLeastOnce(t, c, "alice", want[len(want)-1])
	}
	time.Sleep(offline / 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.RestartServices(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		want = append(want, fmt.Sprintf("after-%d", i))
		sendAtLeastOnce(t, c, "alice", want[len(want)-1])
	}
	time.Sleep(offline / 2)
	if n := len(testcluster.Stored(t, c, "alice")); n != len(want) {
		t.Fatalf("%d stored, want %d", n, len(want))
	}

	rec := newRecorder()
	cl := dialCluster(t, c, sdk.TransportWebSocket, "alice", "lobby", rec.config(sdk.Config{}))
	waitBodies(t, rec, len(want), 5*time.Second)
	waitStoredEmpty(t, c, "alice")
	// Past the login's second read (a second after the LoginAck): copies would have come by now.
	time.Sleep(1200 * time.Millisecond)
	if got := rec.bodies(); !slices.Equal(got, want) {
		t.Fatalf("the app got %q, want %q once each, in order", got, want)
	}
	rec.mu.Lock()
	for _, m := range rec.msgs {
		if !m.GetAtLeastOnce() {
			t.Errorf("message %q not marked at-least-once", m.GetBody())
		}
	}
	rec.mu.Unlock()
	cl.Close()

	rec = newRecorder()
	dialCluster(t, c, sdk.TransportTCP, "alice", "lobby", rec.config(sdk.Config{}))
	testcluster.WaitOnline(t, c, "alice")
	sendAtLeastOnce(t, c, "alice", "fresh")
	if got := waitBodies(t, rec, 1, 5*time.Second); !slices.Equal(got, []string{"fresh"}) {
		t.Fatalf("the login after the acks got %q, want only the new message", got)
	}
	waitStoredEmpty(t, c, "alice")
}

// TestClusterInboxCopyDropped: an at-least-once message reaches an online client, whose node
// dies while the app is still handling it (so it is not acknowledged yet); the stored copy the
// next login brings is dropped by id, and the app's answer acknowledges the message once.
func TestClusterInboxCopyDropped(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	rec := newRecorder()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg := rec.config(sdk.Config{ReconnectMinDelay: 50 * time.Millisecond, ReconnectMaxDelay: 200 * time.Millisecond})
	record := cfg.OnMessage
	cfg.OnMessage = func(m *clientpb.Message) {
		record(m)
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	cl := dialCluster(t, c, sdk.TransportWebSocket, "bob", "lobby", cfg)
	testcluster.WaitOnline(t, c, "bob")
	sendAtLeastOnce(t, c, "bob", "gift")
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the message did not arrive")
	}
	first := cl.LoginAck().GetSessionId()
	for _, n := range c.Nodes {
		if n.Name() == cl.LoginAck().GetNode() {
			n.Kill()
		}
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if cl.LoginAck().GetSessionId() == first {
			return fmt.Errorf("not logged in again yet")
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // the stored copy comes after the new LoginAck
	close(release)
	waitStoredEmpty(t, c, "bob")
	if got := rec.bodies(); !slices.Equal(got, []string{"gift"}) {
		t.Fatalf("the app got %q, want the message once", got)
	}
}
