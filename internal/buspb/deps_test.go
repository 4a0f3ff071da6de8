package buspb_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestDeps holds the protocol's packages to their audiences: the bus (buspb) and what it shares
// with the server API (roompb) do not import the API (apipb) nor gRPC, and the client protocol
// (clientpb) imports no other package of Roomcast. The SDK's own rule is sdk's TestDeps.
func TestDeps(t *testing.T) {
	t.Parallel()
	for pkg, allowed := range map[string][]string{
		"roomcast/proto/clientpb": nil,
		"roomcast/proto/roompb":   {"roomcast/proto/clientpb"},
		"roomcast/internal/buspb": {"roomcast/proto/clientpb", "roomcast/proto/roompb"},
	} {
		// go test puts its own go first on PATH.
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			t.Fatalf("go list %s: %v\n%s", pkg, err, ee.Stderr)
		} else if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		ok := map[string]bool{pkg: true}
		for _, a := range allowed {
			ok[a] = true
		}
		for _, dep := range strings.Fields(string(out)) {
			switch {
			case dep == "google.golang.org/grpc" || strings.HasPrefix(dep, "google.golang.org/grpc/"):
				t.Errorf("%s depends on gRPC: %s", pkg, dep)
			case (dep == "roomcast" || strings.HasPrefix(dep, "roomcast/")) && !ok[dep]:
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
