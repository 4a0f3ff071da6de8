package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader in different goroutines.
type syncBuffer = testkit.Buffer

// TestDevThenProbe runs `roomcast dev` and `roomcast probe` against it, as the README's quick
// start does, then stops dev the way Ctrl-C does.
func TestDevThenProbe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // when the test fails before it stops dev itself
	var devOut, devErr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--data", t.TempDir()}, &devOut, &devErr)
	}()
	var url string
	re := regexp.MustCompile(`dispatch\s+(http://\S+)/v1/dispatch`)
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		m := re.FindStringSubmatch(devOut.String())
		if m == nil {
			return fmt.Errorf("dev printed no banner; stderr:\n%s", devErr.String())
		}
		url = m[1]
		return nil
	})
	for _, want := range []string{"demo page", "chatlink cl-1", "chatlink cl-2", "roomcast token --secret " + devcluster.Secret} {
		if !strings.Contains(devOut.String(), want) {
			t.Errorf("banner lacks %q:\n%s", want, devOut.String())
		}
	}

	// Every probe must deliver everything. Which nodes its four clients land on is the
	// dispatcher's weighted draw: right after start, with this machine busy with other tests,
	// one node's CPU or bus round-trip reading can put it out of the near-equal margin, so a
	// run on one node is tried again (twice at most) for the cross-node path.
	for attempt := 1; ; attempt++ {
		var out, errOut bytes.Buffer
		room := fmt.Sprintf("r%d", attempt)
		code := run(context.Background(), []string{"probe", "--dispatcher", url, "--room", room, "--clients", "4", "--messages", "25"}, &out, &errOut)
		if code != 0 || !strings.Contains(out.String(), "delivered=300/300") {
			t.Fatalf("probe exit %d:\n%s%s", code, out.String(), errOut.String())
		}
		if strings.Contains(out.String(), "nodes=2") {
			break
		}
		if attempt == 3 {
			t.Fatalf("three probes, each on one node only:\n%s", out.String())
		}
		t.Logf("probe on one node, trying again: %s", out.String())
		waitForReports(t, url)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited %d: %s", code, devErr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dev did not stop within 10s of the interrupt")
	}
}

// waitForReports waits until the dispatcher at url has a load report from every node made after
// the call: fresh CPU and bus readings.
func waitForReports(t *testing.T, url string) {
	t.Helper()
	since := time.Now()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get(url + "/v1/nodes")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var view struct {
			Nodes []struct {
				Node        string
				ReportAgeMs int64 `json:"report_age_ms"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
			return err
		}
		for _, n := range view.Nodes {
			if age := time.Duration(n.ReportAgeMs) * time.Millisecond; age >= time.Since(since) {
				return fmt.Errorf("node %s last reported %v ago, before the wait began", n.Node, age)
			}
		}
		return nil
	})
}

func TestToken(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"token", "--secret", "s3", "--app", "a", "--uid", "u", "--room", "r", "--tags", "class:3,role:student"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	c, err := auth.Keyring{"a": []byte("s3")}.Verify(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	if c.UID != "u" || c.Room != "r" || strings.Join(c.Tags, ",") != "class:3,role:student" {
		t.Fatalf("claims %+v", c)
	}
	for _, args := range [][]string{
		{"token", "--app", "a", "--uid", "u", "--room", "r"},                    // no secret
		{"token", "--secret", "s", "--app", "a", "--uid", "u u", "--room", "r"}, // bad uid
		{"nonsense"},
		{},
	} {
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code := run(context.Background(), []string{"token", "--help"}, &out, &errOut); code != 0 {
		t.Errorf("token --help: exit %d", code)
	}
}

// TestPackagesHaveDocs checks that every package in the module says what it is for.
func TestPackagesHaveDocs(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		files, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		documented := map[string]bool{} // by package name
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			documented[f.Name.Name] = documented[f.Name.Name] || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
		}
		for name, ok := range documented {
			if !ok {
				t.Errorf("package %s (%s) has no doc comment", name, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("walked from %s, which is not the module root: %v", root, err)
	}
}

// TestRolesAsSeparateProcesses runs the roles as production does, each with its own flags and
// NATS connection (here in one test process, against a NATS server of their own), checks them
// end to end with the probe, then drains one ChatLink with `roomcast drain`.
func TestRolesAsSeparateProcesses(t *testing.T) {
	t.Parallel()
	ns, err := devnats.Start(devnats.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type role struct {
		name string
		done chan int
		out  *syncBuffer
	}
	start := func(args ...string) role {
		r := role{name: args[0], done: make(chan int, 1), out: &syncBuffer{}}
		go func() { r.done <- run(ctx, args, r.out, r.out) }()
		return r
	}
	api := testkit.FreeAddr(t)
	auditFile := filepath.Join(t.TempDir(), "audit.log")
	svcOps := testkit.FreeAddr(t)
	services := start("services", "--nats", ns.ClientURL(), "--listen", api, "--grpc-listen", "127.0.0.1:0", "--ops", svcOps, "--api-key", "k1=demo",
		"--log-format", "json", "--audit-log", auditFile)
	var links []role
	ops := []string{testkit.FreeAddr(t), testkit.FreeAddr(t)}
	for i, name := range []string{"edge-a", "edge-b"} {
		links = append(links, start("chatlink", "--nats", ns.ClientURL(), "--node", name, "--secret", "demo="+devcluster.Secret,
			"--ws", "127.0.0.1:0", "--tcp", "127.0.0.1:0", "--ops", ops[i], "--drain-spread", "200ms"))
	}
	// Under -race on a loaded CI machine a role's start (NATS connection, KV watchers, first
	// load report) has taken more than 15 s; a role that exits early fails at once.
	testkit.CheckFor(t, 45*time.Second, 50*time.Millisecond, func() error {
		for _, r := range append([]role{services}, links...) {
			select {
			case code := <-r.done:
				t.Fatalf("%s exited %d while starting:\n%s", r.name, code, r.out.String())
			default:
			}
		}
		resp, err := http.Get("http://" + api + "/v1/dispatch")
		if err != nil {
			return err
		}
		var ans struct{ Nodes []struct{ Node string } }
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if len(ans.Nodes) != 2 {
			var known []byte
			if resp, err := http.Get("http://" + svcOps + "/v1/nodes"); err == nil {
				known, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			return fmt.Errorf("the ChatLinks did not show up in dispatch (%d nodes: %v); /v1/nodes: %s\nservices:\n%s\nedge-a:\n%s\nedge-b:\n%s",
				len(ans.Nodes), ans.Nodes, known, services.out.String(), links[0].out.String(), links[1].out.String())
		}
		return nil
	})

	// Both kinds of role answer /healthz in one JSON shape (internal/roles.Health).
	for _, url := range []string{"http://" + api, "http://" + ops[0]} {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h struct{ Status string }
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || h.Status != "ok" {
			t.Fatalf("%s/healthz: %d %+v %v, want 200 and status ok", url, resp.StatusCode, h, err)
		}
	}

	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"probe", "--dispatcher", "http://" + api, "--clients", "4", "--messages", "10"}, &out, &errOut); code != 0 {
		t.Fatalf("probe exit %d: %s%s", code, out.String(), errOut.String())
	}
	// A call that changes something is in the audit file, in JSON like the services' logs.
	req, _ := http.NewRequest("POST", "http://"+api+"/v1/rooms/closing/close", strings.NewReader(`{"reason":"done"}`))
	req.Header.Set("Authorization", "Bearer k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	audit, err := os.ReadFile(auditFile)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(audit, &rec); err != nil || rec["audit"] != true || rec["role"] != "services" ||
		rec["method"] != "POST /v1/rooms/{room}/close" || rec["room"] != "closing" || rec["app"] != "demo" {
		t.Fatalf("audit log %q (%v), want one JSON record of the close", audit, err)
	}
	for line := range strings.Lines(services.out.String()) {
		if !json.Valid([]byte(line)) {
			t.Fatalf("services' --log-format json wrote %q", line)
		}
	}

	if code := run(ctx, []string{"drain", "--nats", ns.ClientURL(), "--node", "edge-a", "--spread", "100ms"}, &out, &errOut); code != 0 {
		t.Fatalf("drain exit %d: %s", code, errOut.String())
	}
	select {
	case code := <-links[0].done:
		if code != 0 {
			t.Fatalf("drained chatlink exited %d:\n%s", code, links[0].out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drained ChatLink did not exit")
	}
	if code := run(ctx, []string{"drain", "--nats", ns.ClientURL(), "--node", "no-such-node"}, &out, &errOut); code != 1 {
		t.Fatalf("draining an unknown node: exit %d, want 1", code)
	}
	cancel()
	for _, r := range []role{services, links[1]} {
		select {
		case code := <-r.done:
			if code != 0 {
				t.Fatalf("%s exited %d:\n%s", r.name, code, r.out.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not stop", r.name)
		}
	}
}
