package testkit

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

// StartCluster starts a cluster with its data in t's temporary directory, on free ports; each
// option adjusts the configuration first (zero values are devcluster's defaults: two
// ChatLinks). Clusters share nothing, so tests that each start their own may run in parallel.
// The cluster stops when t ends.
func StartCluster(t testing.TB, opts ...Option) *devcluster.Cluster {
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
