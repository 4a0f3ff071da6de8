package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// module is the module path every package's import path starts with.
const module = "roomcast"

// kind is what a package is for, which decides what it may import.
type kind string

const (
	kindProto     kind = "proto"     // proto/...: the wire contracts, generated code
	kindPlumbing  kind = "plumbing"  // internal/...: bus connection, ids, metrics, certificates
	kindStore     kind = "store"     // store/...: one home for each shared bucket or stream
	kindLibrary   kind = "library"   // a component-level folder many components use as a library
	kindComponent kind = "component" // a folder per component
	kindSDK       kind = "sdk"       // the client SDK: a component apps import, so stricter
	kindTool      kind = "tool"      // internal/tools/...: roomcast probe and bench, SDK clients
	kindAssembly  kind = "assembly"  // internal/roles/...: the roles and the dev cluster of them
	kindTestkit   kind = "testkit"   // internal/testkit/...: what tests share
	kindTest      kind = "test"      // test/...: test-only packages of real-process cases
	kindWiring    kind = "wiring"    // starts roles from their config: may import everything
)

// components are the top-level folders that are components: each may import its own
// sub-packages, and no other component's.
var components = []string{
	"api", "callback", "cdnmanager", "cdnpusher", "chatlink", "console", "dispatcher",
	"presence", "room", "roomqueue",
}

// libraries are top-level folders many components use as a library: no process, no bus, no
// store of their own.
var libraries = []string{
	// tag: member tags and tag expressions, compiled and evaluated by the ChatLinks, the room
	// service, the room queue service and the server API alike.
	"tag",
}

// wiring is the code that starts roles from their config for a binary or a program.
var wiring = []string{"cmd", "examples"}

// folders maps the folders of a kind of their own to it: the tools behind roomcast probe and
// roomcast bench, outside the SDK; the assembly of the roles (internal/roles starts each role
// from its config, internal/roles/devcluster all of them in one process with devnats and
// devs3); what tests share, the in-process cluster per test (testkit/testcluster) included;
// the test-only packages that drive a deployment of real processes (test/chaos).
var folders = []struct {
	dir  string
	kind kind
}{
	{"internal/tools", kindTool},
	{"internal/roles", kindAssembly},
	{"internal/testkit", kindTestkit},
	{"test", kindTest},
}

// allowed says which kinds each kind may import. A component and the SDK may also import their
// own sub-packages (sameComponent); wiring may import everything. No kind but the tests and
// test support imports test support, and only wiring and the tests import a tool: neither is
// linked into a role.
var allowed = map[kind][]kind{
	kindProto:     {kindProto},
	kindPlumbing:  {kindPlumbing, kindProto},
	kindStore:     {kindPlumbing, kindProto},
	kindLibrary:   {kindPlumbing, kindProto},
	kindComponent: {kindStore, kindLibrary, kindPlumbing, kindProto},
	kindSDK:       {kindProto},
	kindTool:      {kindTool, kindSDK, kindLibrary, kindPlumbing, kindProto},
	kindAssembly:  {kindAssembly, kindComponent, kindStore, kindLibrary, kindPlumbing, kindProto},
	kindTestkit:   {kindTestkit, kindAssembly, kindStore, kindPlumbing, kindProto},
	kindTest:      {kindTestkit, kindTool, kindSDK, kindStore, kindPlumbing, kindProto},
}

// exceptions are the imports the rules above refuse and that are allowed all the same, each
// with its reason. The test fails when one is no longer used, so that the list stays true.
var exceptions = map[[2]string]string{
	{"room", "callback"}: "callback is the room service's client of the apps' webhooks: it has " +
		"no process, bus subscription or store of its own, only the room service runs it",
}

// classify returns the kind of the package at path (relative to the module) and, for a
// component or the SDK, the folder it belongs to.
func classify(path string) (kind, string) {
	under := func(dirs []string) (string, bool) {
		for _, d := range dirs {
			if path == d || strings.HasPrefix(path, d+"/") {
				return d, true
			}
		}
		return "", false
	}
	if d, ok := under(wiring); ok {
		return kindWiring, d
	}
	for _, f := range folders {
		if d, ok := under([]string{f.dir}); ok {
			return f.kind, d
		}
	}
	if d, ok := under(components); ok {
		return kindComponent, d
	}
	if d, ok := under(libraries); ok {
		return kindLibrary, d
	}
	if d, ok := under([]string{"sdk"}); ok {
		return kindSDK, d
	}
	switch top, _, _ := strings.Cut(path, "/"); top {
	case "proto":
		return kindProto, top
	case "store":
		return kindStore, path
	case "internal":
		return kindPlumbing, path
	}
	return "", ""
}

// pkg is what go list says of a package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string // every package it needs, transitively (TestClosures)
	Error      *struct{ Err string }
}

// listPackages reads the module's packages and their imports (not their tests') from go list.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to read the import graph: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-e", "-json=ImportPath,Imports,Deps,Error", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s: not the module's tree", len(pkgs), module)
	}
	return pkgs
}

// check returns the imports of pkgs that break the rules, and the exceptions no import uses.
func check(pkgs []pkg) (violations, unused []string) {
	used := map[[2]string]bool{}
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok {
			continue
		}
		fromKind, fromDir := classify(from)
		if fromKind == "" {
			violations = append(violations, fmt.Sprintf("%s: a package of no known kind; classify it in internal/deptest", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ok := strings.CutPrefix(imp, module+"/")
			if !ok || fromKind == kindWiring {
				continue
			}
			toKind, toDir := classify(to)
			switch {
			case toKind == "":
				continue // reported as the importer of its own
			case (fromKind == kindComponent || fromKind == kindSDK) && toDir == fromDir:
				continue // a component's own sub-packages
			case slices.Contains(allowed[fromKind], toKind):
				continue
			}
			if _, ok := exceptions[[2]string{fromDir, toDir}]; ok {
				used[[2]string{fromDir, toDir}] = true
				continue
			}
			violations = append(violations, fmt.Sprintf("%s (%s) imports %s (%s)", from, fromKind, to, toKind))
		}
	}
	for e := range exceptions {
		if !used[e] {
			unused = append(unused, e[0]+" -> "+e[1])
		}
	}
	sort.Strings(violations)
	sort.Strings(unused)
	return violations, unused
}

// TestImports fails when a package of the module imports what its kind must not: a component
// another component, a store a component, plumbing a store, the SDK anything but proto.
func TestImports(t *testing.T) {
	violations, unused := check(listPackages(t))
	for _, v := range violations {
		t.Errorf("%s", v)
	}
	for _, e := range unused {
		t.Errorf("the exception %s is no longer needed: remove it from internal/deptest", e)
	}
}

// closures are the packages whose whole dependency tree is a promise to their audience: each
// may depend, of Roomcast, only on the packages named (and on no gRPC package). The SDK and the
// mobile bindings compile the client protocol and the segment format, nothing of the server
// (docs/go-sdk.md); the client protocol imports no other package of Roomcast; the bus and what
// it shares with the server API (roompb) import neither the API nor gRPC.
var closures = map[string][]string{
	"sdk":            {"proto/clientpb", "proto/segment"},
	"sdk/mobile":     {"sdk", "proto/clientpb", "proto/segment"},
	"proto/clientpb": nil,
	"proto/roompb":   {"proto/clientpb"},
	"internal/buspb": {"proto/clientpb", "proto/roompb"},
}

// checkClosures returns what the packages of closures depend on, directly or not, that they
// must not.
func checkClosures(pkgs []pkg) (violations []string) {
	byPath := map[string]pkg{}
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	for from, ok := range closures {
		p, found := byPath[module+"/"+from]
		if !found {
			violations = append(violations, fmt.Sprintf("%s: no such package; update closures in internal/deptest", from))
			continue
		}
		for _, dep := range p.Deps {
			rel, ours := strings.CutPrefix(dep, module+"/")
			switch {
			case dep == "google.golang.org/grpc" || strings.HasPrefix(dep, "google.golang.org/grpc/"):
				violations = append(violations, fmt.Sprintf("%s depends on gRPC: %s", from, dep))
			case ours && !slices.Contains(ok, rel):
				violations = append(violations, fmt.Sprintf("%s depends on %s", from, rel))
			}
		}
	}
	sort.Strings(violations)
	return violations
}

// TestClosures fails when a package of closures depends, directly or not, on gRPC or on a
// package of Roomcast it must not: `go list -deps ./sdk ./sdk/mobile` holds no gRPC package.
func TestClosures(t *testing.T) {
	for _, v := range checkClosures(listPackages(t)) {
		t.Errorf("%s", v)
	}
}

// TestRules checks the rules themselves on a made-up graph: each kind of import that must fail
// does, and those that may pass do.
func TestRules(t *testing.T) {
	graph := func(edges ...string) []pkg {
		var pkgs []pkg
		for _, e := range edges {
			from, to, _ := strings.Cut(e, " -> ")
			pkgs = append(pkgs, pkg{ImportPath: module + "/" + from, Imports: []string{module + "/" + to}})
		}
		// The exceptions are used, so that only the edges under test are reported.
		for e := range exceptions {
			pkgs = append(pkgs, pkg{ImportPath: module + "/" + e[0], Imports: []string{module + "/" + e[1]}})
		}
		return pkgs
	}
	for _, c := range []struct {
		edge string
		ok   bool
	}{
		{"api -> store/roomstore", true},
		{"chatlink -> chatlink/internal/uring", true},
		{"chatlink -> tag", true},
		{"room -> proto/clientpb", true},
		{"store/inbox -> internal/bus", true},
		{"sdk/mobile -> sdk", true},
		{"internal/roles -> room", true},
		{"internal/roles/devcluster -> internal/roles", true},
		{"internal/tools/loadgen -> sdk", true},
		{"internal/tools/loadgen -> internal/tools/cdnedge", true},
		{"internal/tools/loadgen -> internal/netpoll", true},
		{"chatlink -> internal/netpoll", true},
		{"internal/testkit -> internal/roles/devnats", true},
		{"internal/testkit/testcluster -> store/inbox", true},
		{"test/chaos -> internal/testkit/procs", true},
		{"test/chaos -> internal/tools/loadgen", true},
		{"cmd/roomcast -> internal/tools/probe", true},
		{"api -> room", false},
		{"roomqueue -> room", false},
		{"chatlink -> dispatcher/internal/x", false},
		{"store/roomstore -> room", false},
		{"store/roomstore -> tag", false},
		{"store/cdnstore -> store/roomstore", false},
		{"internal/bus -> store/inbox", false},
		{"internal/bus -> room", false},
		{"sdk -> internal/bus", false},
		{"proto/segment -> internal/bus", false},
		{"internal/roles -> internal/tools/loadgen", false},
		{"internal/roles/devcluster -> internal/testkit", false},
		{"internal/roles -> sdk", false},
		{"room -> internal/testkit", false},
		{"internal/bus -> internal/testkit/s3test", false},
		{"internal/tools/probe -> room", false},
		{"internal/tools/loadgen -> internal/testkit", false},
		{"internal/tools/loadgen -> chatlink/internal/uring", false},
		{"internal/testkit -> room", false},
		{"test/chaos -> internal/roles/devcluster", false},
		{"newfolder -> proto/clientpb", false},
		{"testdata -> proto/clientpb", false},
	} {
		violations, unused := check(graph(c.edge))
		if len(unused) > 0 {
			t.Fatalf("%s: unused exceptions %v", c.edge, unused)
		}
		if got := len(violations) == 0; got != c.ok {
			t.Errorf("%s: allowed %v, want %v (%v)", c.edge, got, c.ok, violations)
		}
	}
}
