// Package deptest holds the module's import rules as a test (deptest_test.go), in the manner of
// tailscale's tstest/deptest: it reads the real import graph with `go list` and fails when a
// package imports what its kind must not. Components import stores, proto and plumbing, never
// each other; stores import only plumbing and proto; the SDK imports only proto; the tools
// (internal/tools) import the SDK, plumbing and proto; the assembly of the roles
// (internal/roles, its devcluster, devnats and devs3) imports components, never a tool or test
// support; test support (internal/testkit) and the real-process tests (test/) are imported by
// no role; only the wiring (cmd, examples) imports everything. It has no code for other
// packages to import.
package deptest
