package main

import (
	"context"
	"fmt"
	"io"
)

// runProbe is the end-to-end check README.md describes (`roomcast probe`). It is built on the
// Go SDK (sdk/), which is not in this tree yet; until it is, the command says so and fails,
// and the binary builds.
func runProbe(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "roomcast probe: not in this build: it needs the Go SDK (sdk/), which has not landed yet")
	return 1
}
