//go:build unix

package procs

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/s3test"
)

// The deployment's app, its token secret and the server API's key.
const (
	App    = "demo"
	Secret = "s3cr3t"
	APIKey = "k1"
)

// BuildRoomcast builds the roomcast binary (cmd/roomcast) into dir and returns its path.
func BuildRoomcast(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "roomcast")
	if out, err := exec.Command("go", "build", "-o", bin, "roomcast/cmd/roomcast").CombinedOutput(); err != nil {
		t.Fatalf("building roomcast: %v\n%s", err, out)
	}
	return bin
}

// binaries are roomcast and nats-server, built once per test binary by Binaries into binDir,
// which Main removes.
var (
	binDir  string
	buildMu sync.Mutex // guards built
	built   *Binaries
)

// Binaries are the programs a deployment runs.
type Binaries struct{ Roomcast, NATSServer string }

// Main runs a package's tests (call it from TestMain) and removes the binaries Binaries built.
func Main(m *testing.M) {
	dir, err := os.MkdirTemp("", "roomcast-procs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// GetBinaries builds roomcast and nats-server the first time a test asks, and returns them; the
// package's TestMain must call Main.
func GetBinaries(t testing.TB) Binaries {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if binDir == "" {
		t.Fatal("procs: the package's TestMain does not call procs.Main")
	}
	if built == nil {
		built = &Binaries{Roomcast: BuildRoomcast(t, binDir), NATSServer: BuildNATSServer(t, binDir)}
	}
	return *built
}

// Role is one roomcast process and where it listens.
type Role struct {
	*Proc
	// Ops is the address of its /readyz and /metrics.
	Ops string
	// API is the services' server API and dispatcher (host:port); empty for other roles.
	API string
	// Node, WS and TCP are a ChatLink's name and listeners; empty for other roles.
	Node, WS, TCP string
}

// Ready reports whether the role's /readyz answers 200.
func (r *Role) Ready() error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + r.Ops + "/readyz")
	if err != nil {
		return fmt.Errorf("%s: %w", r.Name, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /readyz: %s", r.Name, resp.Status)
	}
	return nil
}

// Config says what a deployment runs. Zero values mean the deployment: 2 of each.
type Config struct {
	// DeployDir is the repository's deploy/ folder, whose NATS configs and roomcast.yaml the
	// processes run. Required.
	DeployDir string
	// Services, ChatLinks and Pushers are how many processes of each role run. Zero values
	// mean 2, 2 and 1.
	Services, ChatLinks, Pushers int
	// ChatLinkArgs are added to every ChatLink's command line, e.g. --drain-spread 2s.
	ChatLinkArgs []string
	// ServicesArgs are added to every services process's command line.
	ServicesArgs []string
}

// Deployment is a running deployment: NATS, S3 and the roles, each its own process.
type Deployment struct {
	Bin       Binaries
	NATS      *NATS
	S3        *s3test.Server
	Services  []*Role
	ChatLinks []*Role
	Pushers   []*Role

	cfg    Config
	config string // deploy/roomcast.yaml
}

// Start starts a deployment and waits until every role is ready; everything is killed when t
// ends.
func Start(t testing.TB, cfg Config) *Deployment {
	t.Helper()
	if cfg.Services == 0 {
		cfg.Services = 2
	}
	if cfg.ChatLinks == 0 {
		cfg.ChatLinks = 2
	}
	if cfg.Pushers == 0 {
		cfg.Pushers = 1
	}
	d := &Deployment{Bin: GetBinaries(t), cfg: cfg, config: filepath.Join(cfg.DeployDir, "roomcast.yaml")}
	d.NATS = StartNATS(t, d.Bin.NATSServer, cfg.DeployDir)
	d.S3 = s3test.Start(t)
	// Services first, one at a time: the first creates the streams and buckets with the file's
	// 3 replicas, which the others then find.
	for i := range cfg.Services {
		d.Services = append(d.Services, d.startServices(t, i))
		d.WaitReady(t, d.Services[i])
	}
	for i := range cfg.ChatLinks {
		d.ChatLinks = append(d.ChatLinks, d.NewChatLink(t, fmt.Sprintf("edge-%d", i+1)))
		d.ChatLinks[i].Start()
	}
	for i := range cfg.Pushers {
		r := &Role{Ops: freeAddr(t)}
		r.Proc = NewProc(t, fmt.Sprintf("cdnpusher-%d", i+1), d.Bin.Roomcast, "cdnpusher", "--config", d.config,
			"--nats", d.NATS.URL(), "--id", fmt.Sprintf("pusher-%d", i+1), "--ops", r.Ops,
			"--s3-endpoint", d.S3.Endpoint, "--s3-bucket", s3test.Bucket, "--s3-secure=false",
			"--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey)
		r.Start()
		d.Pushers = append(d.Pushers, r)
	}
	d.WaitReady(t, append(d.ChatLinks, d.Pushers...)...)
	return d
}

func (d *Deployment) startServices(t testing.TB, i int) *Role {
	r := &Role{Ops: freeAddr(t), API: freeAddr(t)}
	args := append([]string{"services", "--config", d.config, "--nats", d.NATS.URL(),
		"--api-key", APIKey + "=" + App, "--listen", r.API, "--grpc-listen", "127.0.0.1:0", "--ops", r.Ops,
	}, d.cfg.ServicesArgs...)
	r.Proc = NewProc(t, fmt.Sprintf("services-%d", i+1), d.Bin.Roomcast, args...)
	r.Start()
	return r
}

// NewChatLink returns a ChatLink named node on free ports, not started.
func (d *Deployment) NewChatLink(t testing.TB, node string) *Role {
	r := &Role{Ops: freeAddr(t), Node: node, WS: freeAddr(t), TCP: freeAddr(t)}
	args := append([]string{"chatlink", "--config", d.config, "--nats", d.NATS.URL(), "--node", node,
		"--secret", App + "=" + Secret, "--tls-cert", "", "--tls-key", "",
		"--ws", r.WS, "--tcp", r.TCP, "--ops", r.Ops,
	}, d.cfg.ChatLinkArgs...)
	r.Proc = NewProc(t, node, d.Bin.Roomcast, args...)
	return r
}

// WaitReady waits up to 30 s until every role's /readyz answers 200.
func (d *Deployment) WaitReady(t testing.TB, roles ...*Role) {
	t.Helper()
	for _, r := range roles {
		testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			select {
			case <-r.Exited():
				t.Fatalf("%s exited:\n%s", r.Name, r.Output())
			default:
			}
			return r.Ready()
		})
	}
}

// Dispatcher is the base URL of the first services process's dispatcher.
func (d *Deployment) Dispatcher() string { return "http://" + d.Services[0].API }
