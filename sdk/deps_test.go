package sdk_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestDeps holds the SDK to what docs/go-sdk.md promises: an app that imports the Go SDK or the
// mobile bindings compiles the client protocol (proto/clientpb) and the segment format
// (proto/segment) of Roomcast, and nothing of the server: no gRPC, no server API or bus types
// (proto/apipb, internal/buspb), no internal/ package.
func TestDeps(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{
		"roomcast/sdk":            true,
		"roomcast/sdk/mobile":     true,
		"roomcast/proto/clientpb": true,
		"roomcast/proto/segment":  true,
	}
	// go test puts its own go first on PATH.
	out, err := exec.Command("go", "list", "-deps", "roomcast/sdk", "roomcast/sdk/mobile").Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		t.Fatalf("go list: %v\n%s", err, ee.Stderr)
	} else if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, dep := range deps {
		switch {
		case dep == "google.golang.org/grpc" || strings.HasPrefix(dep, "google.golang.org/grpc/"):
			t.Errorf("the SDK depends on gRPC: %s", dep)
		case (dep == "roomcast" || strings.HasPrefix(dep, "roomcast/")) && !allowed[dep]:
			t.Errorf("the SDK depends on %s, a package of the server", dep)
		}
	}
}
