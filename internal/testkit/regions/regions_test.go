package regions_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/regions"
)

// TestSupercluster checks the harness itself: a request from one region to a responder in
// another takes the two links' delays, JetStream in the home region answers a far region, and
// a cut region's messages stop until it heals.
func TestSupercluster(t *testing.T) {
	t.Parallel()
	delays := map[string]time.Duration{"a-b": 40 * time.Millisecond, "a-c": 150 * time.Millisecond, "b-c": 100 * time.Millisecond}
	sc := regions.Start(t, regions.Config{
		Regions: []string{"a", "b", "c"},
		Delay: func(x, y string) time.Duration {
			if x > y {
				x, y = y, x
			}
			return delays[x+"-"+y]
		},
	})
	connect := func(r string) *nats.Conn {
		nc, err := nats.Connect(sc.URL(r))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	a, c := connect("a"), connect("c")
	if _, err := c.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// The subscription's interest crosses the gateway first.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		_, err := a.Request("echo", nil, time.Second)
		return err
	})
	start := time.Now()
	if _, err := a.Request("echo", []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(start)
	if min := 2 * sc.Delay("a", "c"); rtt < min || rtt > min+200*time.Millisecond {
		t.Errorf("round trip a->c->a took %v, want %v plus a little", rtt, min)
	}
	before, err := sc.Gateway("a", "c")
	if err != nil {
		t.Fatal(err)
	}
	if before.Msgs == 0 {
		t.Errorf("gateway a->c counted no messages after requests crossed it")
	}

	// JetStream lives in the home region; a far region's clients reach it over the gateway.
	js, err := jetstream.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "far"})
	if err != nil {
		t.Fatalf("create a KV bucket from the far region: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}

	// What c publishes reaches a, until the cut.
	var up atomic.Int64
	if _, err := a.Subscribe("up", func(*nats.Msg) { up.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if err := c.Publish("up", nil); err != nil {
			return err
		}
		if up.Load() == 0 {
			return errors.New("nothing published in c reached a")
		}
		return nil
	})

	if err := sc.Cut("c"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Request("echo", nil, 500*time.Millisecond); err == nil {
		t.Errorf("a request crossed to a cut region")
	}
	// The cut holds both ways for as long as it lasts: c's servers, retrying their gateways
	// every second or so, do not get through the proxies of the links between the others
	// (whose addresses they learnt by gossip). 3 s: three of their retries.
	upAtCut := up.Load()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err := c.Publish("up", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * sc.Delay("a", "c")) // what could be on its way
	if n := up.Load() - upAtCut; n > 0 {
		t.Errorf("%d messages published in the cut region c reached a", n)
	}
	if err := sc.Heal("c"); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		_, err := a.Request("echo", nil, time.Second)
		return err
	})
}
