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
	kindPlumbing  kind = "plumbing"  // internal/...: bus connection, ids, metrics, test helpers
	kindStore     kind = "store"     // store/...: one home for each shared bucket or stream
	kindLibrary   kind = "library"   // a component-level folder many components use as a library
	kindComponent kind = "component" // a folder per component
	kindSDK       kind = "sdk"       // the client SDK: a component apps import, so stricter
	kindTool      kind = "tool"      // roomcast probe and bench, clients of the SDK
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

// wiring is the code that starts roles from their config, and test assemblies of it.
var wiring = []string{
	"cmd", "examples", "internal/roles", "internal/devcluster",
	"internal/testkit/testcluster", // starts a devcluster for other packages' tests
}

// tools are the clients behind roomcast probe and roomcast bench, outside the SDK.
var tools = []string{"internal/loadgen", "internal/probe"}

// allowed says which kinds each kind may import. A component and the SDK may also import their
// own sub-packages (sameComponent); wiring may import everything.
var allowed = map[kind][]kind{
	kindProto:     {kindProto},
	kindPlumbing:  {kindPlumbing, kindProto},
	kindStore:     {kindPlumbing, kindProto},
	kindLibrary:   {kindPlumbing, kindProto},
	kindComponent: {kindStore, kindLibrary, kindPlumbing, kindProto},
	kindSDK:       {kindProto},
	kindTool:      {kindSDK, kindLibrary, kindPlumbing, kindProto},
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
	if d, ok := under(tools); ok {
		return kindTool, d
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
	Error      *struct{ Err string }
}

// listPackages reads the module's packages and their imports (not their tests') from go list.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to read the import graph: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-e", "-json=ImportPath,Imports,Error", module+"/...")
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
		{"internal/loadgen -> sdk", true},
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
		{"newfolder -> proto/clientpb", false},
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
