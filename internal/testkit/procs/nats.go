//go:build unix

package procs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/testkit"
)

// NATSVersion is the nats-server the module requires, which BuildNATSServer builds.
const NATSVersion = "v2.15.2"

// BuildNATSServer builds nats-server from the module this one requires (as `go install
// github.com/nats-io/nats-server/v2@v2.15.2` builds it) into dir and returns its path.
func BuildNATSServer(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("building nats-server: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "--version").Output(); err != nil || !strings.Contains(string(out), NATSVersion) {
		t.Fatalf("nats-server --version: %q %v", out, err)
	}
	return bin
}

// NATS is a NATS cluster of nats-server processes.
type NATS struct {
	// Servers are the processes, in the order of deploy/nats/'s files.
	Servers []*Proc
	// URLs are their client URLs, in the same order.
	URLs []string
	// Monitors are their monitoring addresses (host:port of /varz, /healthz), in the same order.
	Monitors []string
}

// URL is every server's client URL, comma-separated, as the roles' --nats takes them.
func (n *NATS) URL() string { return strings.Join(n.URLs, ",") }

// StartNATS runs deploy/nats/'s three files (deployDir is deploy/) as they are written, in
// nats-server processes of bin, with only the addresses and the store moved to free local ports
// and a temporary directory; it returns once JetStream answers. A server killed and started
// again keeps its ports and store.
func StartNATS(t testing.TB, bin, deployDir string) *NATS {
	t.Helper()
	dir := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(deployDir, "nats", "nats-*.conf"))
	if len(files) != 3 {
		t.Fatalf("%s/nats has %d server configs, want 3", deployDir, len(files))
	}
	routes := make([]string, len(files))
	n := &NATS{URLs: make([]string, len(files)), Monitors: make([]string, len(files))}
	clients := make([]string, len(files))
	for i := range files {
		routes[i], clients[i], n.Monitors[i] = freeAddr(t), freeAddr(t), freeAddr(t)
	}
	for i, file := range files {
		conf, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		local := strings.NewReplacer(
			"listen: 0.0.0.0:4222", "listen: "+clients[i],
			"listen: 0.0.0.0:6222", "listen: "+routes[i],
			"http: 127.0.0.1:8222", "http: "+n.Monitors[i],
			"store_dir: /var/lib/nats", "store_dir: "+strconv.Quote(filepath.Join(dir, fmt.Sprint(i))),
			"nats-1.internal:6222", routes[0], "nats-2.internal:6222", routes[1], "nats-3.internal:6222", routes[2],
		).Replace(string(conf))
		path := filepath.Join(dir, filepath.Base(file))
		if err := os.WriteFile(path, []byte(local), 0o600); err != nil {
			t.Fatal(err)
		}
		p := NewProc(t, strings.TrimSuffix(filepath.Base(file), ".conf"), bin, "-c", path)
		p.Start()
		n.Servers = append(n.Servers, p)
		n.URLs[i] = "nats://" + clients[i]
	}
	WaitJetStream(t, n.URLs)
	// And every server's JetStream current, as docs/operations.md has operators wait: a bucket
	// of 3 replicas created before that may not get its peers within a role's start timeout.
	for i := range n.Servers {
		testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error { return n.Healthy(i) })
	}
	return n
}

// Connections returns how many client connections server i has (its /varz).
func (n *NATS) Connections(i int) (int, error) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.Monitors[i] + "/varz")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v struct{ Connections int }
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Connections, err
}

// Healthy reports whether server i's /healthz answers ok: it is up and its JetStream current.
func (n *NATS) Healthy(i int) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.Monitors[i] + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /healthz: %s", n.Servers[i].Name, resp.Status)
	}
	return nil
}

// WaitJetStream waits until the servers' JetStream answers: the cluster has elected its leader.
func WaitJetStream(t testing.TB, urls []string) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(strings.Join(urls, ","))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}
