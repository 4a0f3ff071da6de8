// Package testcluster is the part of the test kit (internal/testkit) that starts a whole
// in-process Roomcast deployment (internal/devcluster) for a test: real NATS with JetStream, the
// services, the dispatcher and ChatLinks on free loopback ports, stopped when the test ends. It
// sits apart from testkit because it imports every component, and the components' own
// in-package tests import testkit. Only tests import it; it starts clusters, it does not test
// them.
package testcluster

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/devcluster"
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

// Token returns a login token of the dev app (devcluster.App) for uid in room with tags, valid
// for an hour.
func Token(t testing.TB, uid, room string, tags ...string) string {
	t.Helper()
	tok, err := auth.Mint([]byte(devcluster.Secret), devcluster.App, uid, room, tags, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
