package ociimage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// TestImageRuns builds the image as `make image` does (a static build of cmd/roomcast,
// Write), unpacks its file system without a container runtime, and runs the image's own
// binary: `roomcast version` names the commit, and `roomcast dev` with `roomcast probe` against
// it delivers every message. It also checks that the image runs as a user that is not root
// and that writing it twice gives the same bytes.
func TestImageRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "roomcast")
	const commit = "0123456789abcdef0123456789abcdef01234567"
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.stampedVersion=v0.0.0-test -X main.stampedCommit="+commit, "-o", bin, "roomcast/cmd/roomcast")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfg := Config{Binary: bin, Version: "test", Revision: "abc", Created: time.Unix(1700000000, 0)}
	if ca := "/etc/ssl/certs/ca-certificates.crt"; fileExists(ca) {
		cfg.CACerts = ca
	}
	layout := filepath.Join(dir, "image")
	digest, err := Write(layout, cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Write(filepath.Join(dir, "again"), cfg)
	if err != nil || again != digest {
		t.Errorf("the same inputs gave manifest %s, then %s (%v)", digest, again, err)
	}
	root := filepath.Join(dir, "root")
	run, err := Unpack(layout, root)
	if err != nil {
		t.Fatal(err)
	}
	if run.User != fmt.Sprintf("%d:%d", User, User) || strings.HasPrefix(run.User, "0") {
		t.Errorf("the image runs as %q, want the non-root %d", run.User, User)
	}
	if len(run.Entrypoint) != 1 || run.Entrypoint[0] != "/"+BinaryPath {
		t.Fatalf("entrypoint %q", run.Entrypoint)
	}
	if !bytes.Contains(mustRead(t, filepath.Join(root, "etc/passwd")), []byte(fmt.Sprintf(":%d:%d:", User, User))) {
		t.Error("/etc/passwd does not name the image's user")
	}
	roomcast := filepath.Join(root, run.Entrypoint[0])

	out, err := exec.Command(roomcast, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "roomcast v0.0.0-test\ncommit   "+commit) {
		t.Errorf("roomcast version: %v\n%s\nwant the version and commit it was stamped with", err, out)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var devOut testkit.Buffer
	dev := exec.CommandContext(ctx, roomcast, "dev", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--data", t.TempDir())
	dev.Stdout, dev.Stderr = &devOut, &devOut
	dev.Env = []string{"PATH=/usr/local/bin"} // the image's, less the CA file: dev needs none
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dev.Process.Kill(); _ = dev.Wait() }()
	var url string
	re := regexp.MustCompile(`dispatch\s+(http://\S+)/v1/dispatch`)
	testkit.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		m := re.FindStringSubmatch(devOut.String())
		if m == nil {
			return fmt.Errorf("dev printed no banner:\n%s", devOut.String())
		}
		url = m[1]
		return nil
	})
	probe, err := exec.Command(roomcast, "probe", "--dispatcher", url, "--clients", "4", "--messages", "10").CombinedOutput()
	if err != nil {
		t.Fatalf("roomcast probe: %v\n%s\ndev:\n%s", err, probe, devOut.String())
	}
	t.Logf("probe:\n%s", probe)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
