//go:build unix

// Package procs is the part of the test kit (internal/testkit) that runs a Roomcast deployment
// as real processes on loopback: the roomcast binary and nats-server built once per test
// binary, a NATS cluster from deploy/nats/, the roles from deploy/roomcast.yaml, each in its own
// process group that a test can kill -9, stop with a signal, freeze or restart, and that is
// killed when the test ends whatever happens. Only tests import it; it starts and stops
// processes and says where they listen, it checks nothing about them.
package procs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// maxLog is how much of a process's output a Proc keeps: the last bytes, shown when a test fails.
const maxLog = 64 << 10

// Proc is one process of a deployment. Start runs it again with the same command line.
type Proc struct {
	Name string
	t    testing.TB
	bin  string
	args []string

	mu     sync.Mutex // guards the fields below
	cmd    *exec.Cmd  // nil while stopped
	exited chan struct{}
	out    tail
}

// tail keeps the last maxLog bytes written to it.
type tail struct {
	mu sync.Mutex // guards b
	b  []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > maxLog {
		w.b = append(w.b[:0], w.b[len(w.b)-maxLog:]...)
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.Clone(w.b))
}

// NewProc returns a process of bin with args, not started. When t ends the process is killed
// (its whole process group) and, if t failed, its last output logged.
func NewProc(t testing.TB, name, bin string, args ...string) *Proc {
	p := &Proc{Name: name, t: t, bin: bin, args: args}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.Output())
		}
	})
	return p
}

// Start starts the process (again, once it has exited or was killed); it fails t if it is
// running or cannot start.
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			p.t.Fatalf("%s: started while running", p.Name)
		}
	}
	cmd := exec.Command(p.bin, p.args...)
	fmt.Fprintf(&p.out, "---- start %s\n", time.Now().Format(time.TimeOnly))
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("%s: %v", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
}

// Kill sends SIGKILL to the process group (a crash: nothing is closed cleanly) and waits until
// the process has exited. Killing a stopped process does nothing.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
	p.cmd = nil
}

// Stop sends sig to the process and waits up to wait for it to exit; it reports whether it did
// and its exit code. A process that has not exited by then is killed.
func (p *Proc) Stop(sig syscall.Signal, wait time.Duration) (exited bool, code int) {
	p.mu.Lock()
	cmd, done := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return true, 0
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		p.mu.Lock()
		p.cmd = nil
		p.mu.Unlock()
		return true, cmd.ProcessState.ExitCode()
	case <-time.After(wait):
		p.Kill()
		return false, -1
	}
}

// Exited is closed when the running process exits; nil while stopped.
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Pid is the running process's id, 0 while stopped.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Output is the last of what the process wrote, across its starts.
func (p *Proc) Output() string { return p.out.String() }

// handedOut is the ports freeAddr has handed out in this process.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freeAddr returns a loopback address with a port free right now, below Linux's ephemeral range
// (32768-60999): a process starts listening on it a while later, and meanwhile the test's many
// client connections take their local ports from that range, where testkit.FreeAddr finds its
// ports too. A port is handed out once per test process: the ports of one deployment are all
// picked before its processes listen, so a port free at each pick could otherwise go to two of
// them (it did: nats-1 and nats-3 of one CI run, and the cluster never formed).
func freeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		port := 20000 + rand.IntN(12768)
		if handedOut.ports[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			handedOut.ports[port] = true
			return addr
		}
	}
	t.Fatal("procs: no free port below 32768 in 100 tries")
	return ""
}
