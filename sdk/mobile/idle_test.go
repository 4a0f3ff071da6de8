package mobile_test

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"roomcast/internal/testkit/testcluster"
)

// TestIdleWakeups measures an idle mobile client, alone in a process of its own
// (testdata/idleclient, which imports only this package): its threads' context switches, each a wake-up of the
// process, over a window in which nothing happens in its room but heartbeats, and its memory.
// docs/mobile.md keeps the figures. It checks that the process without a client does not wake,
// that the client's wake-ups grow with its heartbeats (at most 20 thread wake-ups for each:
// the timer, the write, the server's answer, the runtime's threads around them) and stay under
// 200 a minute with the server's 25 s interval, and logs the figures. A measurement of a
// minute and a half: not in -short.
func TestIdleWakeups(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement of a minute and more")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	bin := filepath.Join(t.TempDir(), "idleclient")
	run(t, exec.Command("go", "build", "-o", bin, "./testdata/idleclient"))
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	for _, tc := range []struct {
		heartbeatMs int64
		window      time.Duration
	}{{-1, 20 * time.Second}, {1000, 20 * time.Second}, {0, 60 * time.Second}} {
		name := fmt.Sprintf("heartbeat=%dms", tc.heartbeatMs)
		if tc.heartbeatMs < 0 {
			name = "no client" // the process alone: what the Go runtime and the test binary wake for
		}
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), "ROOMCAST_IDLE_DISPATCHER="+c.URL(),
				"ROOMCAST_IDLE_TOKEN="+testcluster.Token(t, "idle", "idle"),
				"ROOMCAST_IDLE_HEARTBEAT_MS="+strconv.FormatInt(tc.heartbeatMs, 10))
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer stdin.Close()
			sc := bufio.NewScanner(stdout)
			if !sc.Scan() || !strings.HasPrefix(sc.Text(), "ready") {
				t.Fatalf("the idle client did not start: %q", sc.Text())
			}
			heap := strings.TrimPrefix(sc.Text(), "ready ")
			time.Sleep(2 * time.Second) // let the login's work settle
			n, at := watch(t, cmd.Process.Pid, tc.window)
			wakes := int64(len(at))
			rss := status(t, cmd.Process.Pid, "VmRSS")
			interval := time.Duration(tc.heartbeatMs) * time.Millisecond
			if interval <= 0 {
				interval = 25 * time.Second
			}
			beats := float64(tc.window) / float64(interval)
			perMinute := float64(n) * float64(time.Minute) / float64(tc.window)
			t.Logf("%s (heartbeat %v): woke %d times in %v (%.2f a heartbeat): %d thread wake-ups (%.1f a minute, %.2f a heartbeat); RSS %s; Go heap in use %s bytes; woke at %v",
				name, interval, wakes, tc.window, float64(wakes)/beats, n, perMinute, float64(n)/beats, rss, heap, at)
			// A window holds at most ceil(beats) heartbeats; one more wake is allowed for a
			// heartbeat whose answer came more than wakeGap after it on a busy machine.
			maxWakes := int64(math.Ceil(beats)) + 1
			switch {
			case tc.heartbeatMs < 0 && n > 10:
				t.Errorf("the process without a client woke %d times in %v", n, tc.window)
			case tc.heartbeatMs >= 0 && wakes > maxWakes:
				t.Errorf("woke %d times in %v for %.1f heartbeats: more than once a heartbeat", wakes, tc.window, beats)
			case tc.heartbeatMs > 0 && float64(n) > 20*beats:
				t.Errorf("%d thread wake-ups in %v for %.0f heartbeats: more than 20 a heartbeat", n, tc.window, beats)
			case tc.heartbeatMs == 0 && perMinute > 200:
				t.Errorf("%.0f thread wake-ups a minute with the server's heartbeat", perMinute)
			}
		})
	}
}

// wakeGap separates two wakes of the process: thread wake-ups closer together than this are one
// burst (a heartbeat's timer, its write, the server's answer and the runtime's monitor thread
// around them take a few milliseconds), as one wake of the CPU from idle is what costs a battery.
const wakeGap = 200 * time.Millisecond

// watch samples the process's thread wake-ups every 2 ms for window and returns how many there
// were, and when each burst of them began (from the window's start): the times the process
// woke.
func watch(t *testing.T, pid int, window time.Duration) (n int64, wakes []time.Duration) {
	t.Helper()
	first := switches(t, pid)
	last, lastRise := first, time.Time{}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for end := start.Add(window); time.Now().Before(end); {
		now := <-tick.C
		n := switches(t, pid)
		if n > last {
			if now.Sub(lastRise) > wakeGap {
				wakes = append(wakes, now.Sub(start).Round(time.Millisecond))
			}
			lastRise = now
		}
		last = n
	}
	return last - first, wakes
}

// switches sums the voluntary context switches of the process's threads: each is a thread
// going back to sleep after it woke, so a count of wake-ups (a preemption, which a busy machine
// adds, is not one).
func switches(t *testing.T, pid int) int64 {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var n int64
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that ended
		}
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && k == "voluntary_ctxt_switches" {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			}
		}
	}
	return n
}

func status(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
