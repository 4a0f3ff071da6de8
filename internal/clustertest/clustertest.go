// Package clustertest starts a whole in-process Roomcast deployment (internal/devcluster) for a
// test: real NATS with JetStream, the services, the dispatcher and ChatLinks on loopback,
// stopped when the test ends.
package clustertest

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/devcluster"
)

// Start starts a cluster with its data in t's temporary directory; each mutate adjusts the
// configuration first (zero values are devcluster's defaults: two ChatLinks). The cluster
// stops when t ends.
func Start(t testing.TB, mutate ...func(*devcluster.Config)) *devcluster.Cluster {
	t.Helper()
	cfg := devcluster.Config{DataDir: t.TempDir()}
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// ChatLinks sets how many ChatLinks a cluster runs.
func ChatLinks(n int) func(*devcluster.Config) {
	return func(c *devcluster.Config) { c.ChatLinks = n }
}
