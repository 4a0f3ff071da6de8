package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"roomcast/internal/osdep"
)

// DefaultPerProcess is how many clients one process holds at most. The open-file limit here is
// a hard 20,000 per process; each client is a socket, and dispatch requests and the process's
// own files need some more.
const DefaultPerProcess = 18000

// split divides n clients into as few parts of at most per clients as possible, as evenly as
// possible, and returns the size of each part.
func split(n, per int) []int {
	if n <= 0 {
		return nil
	}
	per = max(per, 1)
	k := (n + per - 1) / per
	parts := make([]int, k)
	for i := range parts {
		parts[i] = n / k
		if i < n%k {
			parts[i]++
		}
	}
	return parts
}

// worker runs a share of a run's clients, in this process or in a worker process.
type worker interface {
	// connect returns once every client of the worker was tried.
	connect(ctx context.Context) error
	// status is the worker's latest progress.
	status() status
	// finish waits up to wait for every member to have every accepted message of its
	// audience, closes the clients and reports.
	finish(ctx context.Context, accepted seqSet, wait time.Duration) (report, error)
	// stop ends the worker and its clients at once. It may follow finish.
	stop()
}

// localWorker runs its clients in this process.
type localWorker struct{ f *fleet }

var _ worker = (*localWorker)(nil)

func (w *localWorker) connect(ctx context.Context) error { w.f.connect(ctx); return nil }
func (w *localWorker) status() status                    { return w.f.status() }
func (w *localWorker) stop()                             { w.f.close() }

func (w *localWorker) finish(ctx context.Context, accepted seqSet, wait time.Duration) (report, error) {
	return w.f.awaitAndFinish(ctx, accepted, wait), nil
}

// workerMsg is one line a worker process writes on its standard output.
type workerMsg struct {
	Status *status `json:"status,omitempty"`
	Ready  bool    `json:"ready,omitempty"`
	Report *report `json:"report,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// workerCmd is the line the parent writes after the worker is ready: wait at most WaitMS for
// every member to have the Accepted messages of its audience, then report.
type workerCmd struct {
	Accepted seqSet `json:"accepted"`
	WaitMS   int64  `json:"wait_ms"`
}

// procWorker runs its clients in a child process that runs ServeWorker.
type procWorker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	msgs  chan workerMsg // ready, report and error lines, in order; closed when stdout ends
	st    atomic.Pointer[status]
	once  sync.Once
	wait  chan struct{} // closed when the process has been waited for
}

var _ worker = (*procWorker)(nil)

func startProcWorker(argv []string, sp spec, stderr io.Writer) (*procWorker, error) {
	if len(argv) == 0 {
		return nil, errors.New("bench: no worker command")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start worker %s: %w", argv[0], err)
	}
	w := &procWorker{cmd: cmd, stdin: stdin, msgs: make(chan workerMsg, 4), wait: make(chan struct{})}
	w.st.Store(&status{})
	go w.read(stdout) // ends when the process closes stdout; stop waits for it through wait
	b, _ := json.Marshal(sp)
	if _, err := stdin.Write(append(b, '\n')); err != nil {
		w.stop()
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	return w, nil
}

// read takes the worker's lines until its standard output ends, then waits for the process.
func (w *procWorker) read(stdout io.Reader) {
	defer close(w.wait)
	defer func() { _ = w.cmd.Wait() }()
	defer close(w.msgs)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var m workerMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			w.msgs <- workerMsg{Error: fmt.Sprintf("bad line from worker: %v", err)}
			continue
		}
		if m.Status != nil {
			w.st.Store(m.Status)
			continue
		}
		w.msgs <- m
	}
	_, _ = io.Copy(io.Discard, stdout)
}

func (w *procWorker) next(ctx context.Context) (workerMsg, error) {
	select {
	case m, ok := <-w.msgs:
		if !ok {
			<-w.wait
			return workerMsg{}, fmt.Errorf("bench: worker %d ended: %v", w.cmd.Process.Pid, w.cmd.ProcessState)
		}
		if m.Error != "" {
			return m, fmt.Errorf("bench: worker %d: %s", w.cmd.Process.Pid, m.Error)
		}
		return m, nil
	case <-ctx.Done():
		return workerMsg{}, ctx.Err()
	}
}

func (w *procWorker) connect(ctx context.Context) error {
	m, err := w.next(ctx)
	if err == nil && !m.Ready {
		err = fmt.Errorf("bench: worker %d: expected ready", w.cmd.Process.Pid)
	}
	return err
}

func (w *procWorker) status() status { return *w.st.Load() }

func (w *procWorker) finish(ctx context.Context, accepted seqSet, wait time.Duration) (report, error) {
	b, _ := json.Marshal(workerCmd{Accepted: accepted, WaitMS: wait.Milliseconds()})
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return report{}, fmt.Errorf("bench: worker: %w", err)
	}
	m, err := w.next(ctx)
	if err == nil && m.Report == nil {
		err = fmt.Errorf("bench: worker %d: expected a report", w.cmd.Process.Pid)
	}
	if err != nil {
		return report{}, err
	}
	return *m.Report, nil
}

// stop closes the worker's input, which makes it close its clients and exit, and kills it if
// it has not exited a few seconds later.
func (w *procWorker) stop() {
	w.once.Do(func() {
		_ = w.stdin.Close()
		select {
		case <-w.wait:
		case <-time.After(10 * time.Second):
			_ = w.cmd.Process.Kill()
		}
		// Let the reader finish (it drains stdout) however the process ended.
		go func() {
			for range w.msgs {
			}
		}()
		<-w.wait
	})
}

// ServeWorker runs one worker process of a bench run (`roomcast bench worker`): it reads its
// spec from the first line of in, logs its clients in, writes progress lines and a ready line
// to out, waits for the parent's command line, waits for the expected messages, closes its
// clients and writes its report. When in ends early (the parent went away) or ctx ends, it
// closes its clients and returns.
func ServeWorker(ctx context.Context, in io.Reader, out io.Writer, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wmu sync.Mutex // serializes lines on out
	write := func(m workerMsg) {
		b, _ := json.Marshal(m)
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = out.Write(append(b, '\n'))
	}

	br := bufio.NewReader(in)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench worker: reading spec: %w", err)
	}
	var sp spec
	if err := json.Unmarshal(line, &sp); err != nil {
		write(workerMsg{Error: "bad spec: " + err.Error()})
		return fmt.Errorf("bench worker: bad spec: %w", err)
	}
	cmds := make(chan workerCmd, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // the parent closes in after the report, or to stop the worker
	wg.Go(func() {
		defer cancel()
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		var c workerCmd
		if json.Unmarshal(line, &c) != nil {
			return
		}
		cmds <- c
		_, _ = io.Copy(io.Discard, br)
	})

	f := newFleet(sp, log)
	defer f.close()
	var statusWG sync.WaitGroup
	stopStatus := make(chan struct{})
	statusWG.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopStatus:
				return
			case <-t.C:
				st := f.status()
				write(workerMsg{Status: &st})
			}
		}
	})
	f.connect(ctx)
	close(stopStatus)
	statusWG.Wait()
	st := f.status()
	write(workerMsg{Status: &st})
	write(workerMsg{Ready: true})

	var c workerCmd
	select {
	case c = <-cmds:
	case <-ctx.Done():
		return ctx.Err()
	}
	rep := f.awaitAndFinish(ctx, c.Accepted, time.Duration(c.WaitMS)*time.Millisecond)
	rep.CPUSeconds, rep.MaxRSSBytes = selfUsage()
	write(workerMsg{Report: &rep})
	return nil
}

// selfUsage returns this process's CPU time (user+system) and peak RSS.
func selfUsage() (cpuSeconds float64, maxRSSBytes int64) {
	cpu, _ := osdep.CPU()
	rss, _ := osdep.MaxRSS()
	return cpu.Seconds(), rss
}

// workerCommand is how a worker process is started by default: this binary with
// `bench worker`.
func workerCommand() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: finding this binary for worker processes: %w", err)
	}
	return []string{exe, "bench", "worker"}, nil
}
