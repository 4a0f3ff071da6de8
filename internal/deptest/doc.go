// Package deptest holds the module's import rules as a test (deptest_test.go), in the manner of
// tailscale's tstest/deptest: it reads the real import graph with `go list` and fails when a
// package imports what its kind must not. Components import stores, proto and plumbing, never
// each other; stores import only plumbing and proto; the SDK imports only proto; only the
// wiring (cmd, internal/roles, internal/devcluster, examples) imports everything. It has no code
// for other packages to import.
package deptest
