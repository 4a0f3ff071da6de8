// Package testcluster is the part of the test kit (internal/testkit) that starts a whole
// in-process Roomcast deployment (internal/roles/devcluster) for a test: real NATS with JetStream,
// the services, the dispatcher and ChatLinks on free loopback ports, stopped when the test ends.
// It sits apart from testkit because it imports every component, and the components' own
// in-package tests import testkit. Only tests import it; it starts clusters and looks into them (a
// user's stored messages, whether presence knows a user), it does not test them.
package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/auth"
	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/regions"
	"roomcast/store/inbox"
)

// Option adjusts a cluster's configuration before it starts.
type Option func(*devcluster.Config)

// ChatLinks sets how many ChatLinks a cluster runs.
func ChatLinks(n int) Option {
	return func(c *devcluster.Config) { c.ChatLinks = n }
}

// Start starts a cluster with its data in t's temporary directory, on free ports; each
// option adjusts the configuration first (zero values are devcluster's defaults: two
// ChatLinks). Clusters share nothing, so tests that each start their own may run in parallel.
// The cluster stops when t ends.
func Start(t testing.TB, opts ...Option) *devcluster.Cluster {
	t.Helper()
	cfg := devcluster.Config{DataDir: t.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	// Generous: parallel tests start clusters side by side on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Regions starts a cluster over the supercluster sc (internal/testkit/regions): the services
// connect to its home region's servers, and perRegion ChatLinks to each region's, the home
// region's first, so c.Nodes[i] stands in region sc.Regions()[i/perRegion]. Each option adjusts
// the configuration first, as with Start.
func Regions(t testing.TB, sc *regions.Supercluster, perRegion int, opts ...Option) *devcluster.Cluster {
	t.Helper()
	where := sc.Regions()
	return Start(t, append(opts, func(c *devcluster.Config) {
		c.NATSURL = sc.URL(sc.Home())
		c.ChatLinks = perRegion * len(where)
		c.NodeNATSURL = func(i int) string { return sc.URL(where[(i-1)/perRegion]) }
	})...)
}

// NoMemberCriticalCap lifts the room service's cap on a room's members' critical messages
// (room.Config.MemberCriticalPerSecond), for a test whose members send critical messages in
// bursts so that no budget thins them.
func NoMemberCriticalCap() Option {
	return func(c *devcluster.Config) { c.Room.MemberCriticalPerSecond = -1 }
}

// NoSendLimits lifts the ChatLinks' limits on one connection's and one user's sends
// (chatlink.Limits.SendsPerConn, SendsPerUser: bursts of 40 and 80 by default), for a test
// whose one member sends faster than a person does to check what a stream of messages does.
func NoSendLimits() Option {
	return func(c *devcluster.Config) {
		c.ChatLink.Limits.SendsPerConn, c.ChatLink.Limits.SendsPerUser = ratelimit.Unlimited, ratelimit.Unlimited
	}
}

// Token returns a login token of the dev app (devcluster.App) for uid in room with tags, valid
// for an hour.
func Token(t testing.TB, uid, room string, tags ...string) string {
	t.Helper()
	return TokenWith(t, uid, room, tags)
}

// TokenWith is Token with opts' claims: auth.WithLanes(auth.LaneCritical) lets the member send
// critical messages.
func TokenWith(t testing.TB, uid, room string, tags []string, opts ...auth.MintOption) string {
	t.Helper()
	tok, err := auth.Mint([]byte(devcluster.Secret), devcluster.App, uid, room, tags, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Stored returns the ids of the at-least-once messages stored for uid of the dev app, oldest
// first, read from JetStream.
func Stored(t testing.TB, c *devcluster.Cluster, uid string) []string {
	t.Helper()
	var opts []nats.Option
	if c.NATS != nil {
		opts = append(opts, nats.InProcessServer(c.NATS))
	}
	nc, err := nats.Connect(c.NATSURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stored, err := inbox.NewReader(js).List(ctx, devcluster.App, uid)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range stored {
		ids = append(ids, s.Message.Id)
	}
	return ids
}

// WaitOnline waits until presence knows a session of uid of the dev app: the server API pushes
// to users only the sessions it knows.
func WaitOnline(t testing.TB, c *devcluster.Cluster, uid string) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		req, err := http.NewRequest(http.MethodGet, c.URL()+"/v1/users/"+uid+"/sessions", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out struct{ Online bool }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || !out.Online {
			return fmt.Errorf("%s not online yet (%v)", uid, err)
		}
		return nil
	})
}

// Call makes a server API call over HTTP: method path of c with body and the API key key (none
// when empty), and decodes the JSON answer into out when out is not nil. It returns the HTTP
// status; an answer that is not JSON when out asks for it fails the test.
func Call(t testing.TB, c *devcluster.Cluster, method, path, key, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, c.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: HTTP %d, body is not JSON: %v: %q", method, path, resp.StatusCode, err, raw)
		}
	}
	return resp.StatusCode
}
