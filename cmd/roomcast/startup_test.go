package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// asMainEnv, when set, makes the test binary run main (TestMain): startRoomcast runs it as the
// roomcast command, in a process of its own that can fail, exit and be killed as the real one.
const asMainEnv = "ROOMCAST_TEST_AS_MAIN"

// roomcastProcess is a roomcast command running in a process of its own.
type roomcastProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{} // closed when it has exited
	code           int           // its exit code, once done
}

func startRoomcast(t *testing.T, args ...string) *roomcastProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &roomcastProcess{cmd: exec.Command(exe, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), asMainEnv+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait returns the exit code, failing the test when the process has not exited within d.
func (p *roomcastProcess) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("%q did not exit within %v; stderr:\n%s", p.cmd.Args[1:], d, p.stderr.String())
		return 0
	}
}

// waitRunning waits until the command prints what shows it has started: dev's banner, or a
// role's log line that it serves.
func (p *roomcastProcess) waitRunning(t *testing.T, marker string) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		select {
		case <-p.done:
			t.Fatalf("%q exited %d before it ran; stderr:\n%s", p.cmd.Args[1:], p.code, p.stderr.String())
		default:
		}
		if !strings.Contains(p.stdout.String()+p.stderr.String(), marker) {
			return errors.New("not running yet")
		}
		return nil
	})
}

// expectStartFailure runs roomcast with args and checks that it fails to start as an operator
// should see it: exit code 1, one line on stderr that holds each of wants, and no panic.
func expectStartFailure(t *testing.T, args []string, wants ...string) {
	t.Helper()
	p := startRoomcast(t, args...)
	code := p.wait(t, 40*time.Second)
	stderr := p.stderr.String()
	t.Logf("%q: exit %d, stderr:\n%s", args, code, stderr)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
		t.Errorf("stderr has %d lines, want the one line of the error", len(lines))
	}
	for _, bad := range []string{"panic", "goroutine "} {
		if strings.Contains(stderr+p.stdout.String(), bad) {
			t.Errorf("output holds %q", bad)
		}
	}
	for _, want := range wants {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}

// listening returns the address of a listener the test holds until it ends.
func listening(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// TestStartupErrors checks every start-up failure a new user or operator is likely to meet,
// for dev and each role: exit 1 with one line that names the cause and the fix.
func TestStartupErrors(t *testing.T) {
	t.Parallel()
	// A listener that takes connections and never speaks: a port that is not NATS.
	silent := "nats://" + listening(t)
	inUse := listening(t)
	_, inUsePort, _ := net.SplitHostPort(inUse)
	refused := "nats://" + testkit.FreeAddr(t) // nothing listens there
	js, err := devnats.Start(devnats.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.Shutdown(); js.WaitForShutdown() })
	notAFolder := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notAFolder, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	noJS := startNATSWithoutJetStream(t)
	free := "127.0.0.1:0"
	dev := func(args ...string) []string {
		return append([]string{"dev", "--data", t.TempDir(), "--listen", free, "--grpc-listen", free}, args...)
	}
	services := func(nats string, args ...string) []string {
		return append([]string{"services", "--nats", nats, "--api-key", "k=demo", "--listen", free, "--grpc-listen", free, "--ops", free}, args...)
	}
	chatlinkRole := func(nats string, args ...string) []string {
		return append([]string{"chatlink", "--nats", nats, "--node", "edge-1", "--secret", "demo=s", "--ws", free, "--tcp", free, "--ops", free}, args...)
	}
	pusher := func(nats string, args ...string) []string {
		return append([]string{"cdnpusher", "--nats", nats, "--s3-endpoint", "127.0.0.1:1", "--s3-bucket", "b", "--ops", free}, args...)
	}
	cases := []struct {
		name  string
		args  []string
		wants []string
	}{
		{"dev/listen in use", dev("--listen", inUse), []string{"HTTP listener on " + inUse, "address already in use", "choose another --listen"}},
		{"dev/grpc-listen in use", dev("--grpc-listen", inUse), []string{"gRPC listener", "address already in use", "--grpc-listen"}},
		{"dev/listen bad port", dev("--listen", "127.0.0.1:99999"), []string{"127.0.0.1:99999", "invalid port", "0 to 65535", "--listen"}},
		{"dev/nats-port in use", dev("--nats-port", inUsePort), []string{"NATS listener", "address already in use", "--nats-port"}},
		{"dev/data not a folder", []string{"dev", "--data", filepath.Join(notAFolder, "data")}, []string{"--data", "not a writable directory", "not a directory"}},
		{"services/listen in use", services(refused, "--listen", inUse), []string{"HTTP listener", "address already in use", "--listen"}},
		{"services/listen bad port", services(refused, "--listen", "127.0.0.1:99999"), []string{"invalid port", "--listen"}},
		{"services/nats refused", services(refused), []string{"connect " + refused, "no NATS server answers", "nats-server -js"}},
		{"services/nats silent", services(silent), []string{"connect " + silent, "timeout", "no NATS server answers"}},
		{"services/nats without jetstream", services(noJS), []string{"jetstream", "-js"}},
		{"chatlink/ws in use", chatlinkRole(js.ClientURL(), "--ws", inUse), []string{"WebSocket listener on " + inUse, "address already in use", "--ws"}},
		{"chatlink/tcp in use", chatlinkRole(js.ClientURL(), "--tcp", inUse), []string{"TCP listener on " + inUse, "address already in use", "--tcp"}},
		{"chatlink/ws bad port", chatlinkRole(refused, "--ws", "127.0.0.1:99999"), []string{"WebSocket listener", "invalid port", "--ws"}},
		{"chatlink/tcp bad port", chatlinkRole(refused, "--tcp", "127.0.0.1:99999"), []string{"TCP listener", "invalid port", "--tcp"}},
		{"chatlink/ops in use", chatlinkRole(refused, "--ops", inUse), []string{"ops listener", "address already in use", "--ops"}},
		{"chatlink/nats refused", chatlinkRole(refused), []string{"no NATS server answers", "--nats"}},
		{"chatlink/nats silent", chatlinkRole(silent), []string{"timeout", "no NATS server answers"}},
		{"chatlink/nats without jetstream", chatlinkRole(noJS), []string{"jetstream", "-js"}},
		{"cdnpusher/ops in use", pusher(refused, "--ops", inUse), []string{"ops listener", "address already in use", "--ops"}},
		{"cdnpusher/ops bad port", pusher(refused, "--ops", "127.0.0.1:99999"), []string{"invalid port", "--ops"}},
		{"cdnpusher/nats refused", pusher(refused), []string{"no NATS server answers", "--nats"}},
		{"cdnpusher/nats silent", pusher(silent), []string{"timeout", "no NATS server answers"}},
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := t.TempDir()
		if err := os.Chmod(ro, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(ro, 0o755) })
		cases = append(cases, struct {
			name  string
			args  []string
			wants []string
		}{"dev/data read-only", []string{"dev", "--data", ro}, []string{"--data", "not a writable directory", "permission denied"}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			expectStartFailure(t, tc.args, tc.wants...)
		})
	}
}

// startNATSWithoutJetStream starts a NATS server as `nats-server` without -js runs, and returns
// its URL.
func startNATSWithoutJetStream(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL()
}

// TestRestartAfterKill kills dev and a ChatLink with SIGKILL, which leaves their node names
// leased in JetStream KV, and starts them again at once. dev takes its own previous run's
// leases over and runs (and refuses a second dev on its data directory); the ChatLink role, which cannot tell its previous run from another
// live node of the same name, refuses in one line that says when the lease ends.
func TestRestartAfterKill(t *testing.T) {
	t.Parallel()
	t.Run("dev", func(t *testing.T) {
		t.Parallel()
		data := t.TempDir()
		args := []string{"dev", "--data", data, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"}
		first := startRoomcast(t, args...)
		first.waitRunning(t, "Roomcast dev is running")
		if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		first.wait(t, 10*time.Second)
		again := startRoomcast(t, args...)
		again.waitRunning(t, "Roomcast dev is running")
		// Its data directory is its own while it runs: a second dev on it would run a second
		// NATS server on the same JetStream store.
		expectStartFailure(t, args, "another roomcast dev runs on "+data, "another --data")
		if err := again.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if code := again.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("dev exited %d after Ctrl-C; stderr:\n%s", code, again.stderr.String())
		}
	})
	t.Run("chatlink", func(t *testing.T) {
		t.Parallel()
		ns, err := devnats.Start(devnats.Config{StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		args := []string{"chatlink", "--nats", ns.ClientURL(), "--node", "edge-k", "--secret", "demo=s",
			"--ws", "127.0.0.1:0", "--tcp", "127.0.0.1:0", "--ops", "127.0.0.1:0"}
		first := startRoomcast(t, args...)
		first.waitRunning(t, "chatlink started")
		if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		first.wait(t, 10*time.Second)
		expectStartFailure(t, args, `"edge-k" is leased`, "the lease ends in", "under another --node")
	})
}

// TestHeldLog checks that a role's start-up logs wait for the start's outcome: printed once it
// runs, dropped with everything after when it fails (its one-line error stands alone).
func TestHeldLog(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	h := &heldLog{out: &out}
	_, _ = h.Write([]byte("starting\n"))
	if out.Len() != 0 {
		t.Fatalf("printed %q before the start's outcome", out.String())
	}
	h.release()
	_, _ = h.Write([]byte("running\n"))
	if got := out.String(); got != "starting\nrunning\n" {
		t.Fatalf("after release: %q", got)
	}

	out.Reset()
	h = &heldLog{out: &out}
	_, _ = h.Write([]byte("starting\n"))
	h.drop()
	_, _ = h.Write([]byte("stopping what started\n"))
	if out.Len() != 0 {
		t.Fatalf("a failed start printed %q", out.String())
	}
}
