package loadgen_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roomcast/internal/tools/loadgen"
)

// TestLoginPinned pins the bench to the CPUs it has and a fleet of two stand-in server
// processes to CPU 0, and checks that every thread of each went there and that the result
// says so, per process and in total.
func TestLoginPinned(t *testing.T) {
	t.Parallel()
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	var bench loadgen.CPUList
	for c := range 1024 {
		if mine.IsSet(c) {
			bench = append(bench, c)
		}
	}
	var fleet loadgen.PIDList
	for range 2 {
		cmd := exec.Command(os.Args[0], sleeperFlag)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		fleet = append(fleet, cmd.Process.Pid)
	}
	c := startCluster(t)
	cfg := config(c, 5)
	cfg.Rate = 100
	cfg.PIDs, cfg.BenchCPUs, cfg.ServerCPUs = fleet, bench, loadgen.CPUList{0}
	res, err := loadgen.RunLogin(context.Background(), cfg)
	if err != nil || !res.Passed() {
		t.Fatalf("login: %v\n%s", err, res)
	}
	if res.BenchCPUs != bench.String() || len(res.ServerProcesses) != 2 {
		t.Fatalf("placement %+v, want bench on %s and two server processes", res.Placement, bench)
	}
	var total float64
	for i, p := range res.ServerProcesses {
		if p.PID != fleet[i] || p.CPUs != "0" || p.RSSBytes <= 0 {
			t.Errorf("server process %+v, want pid %d on cpu 0", p, fleet[i])
		}
		total += p.CPUSeconds
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.PID))
		if err != nil || len(tasks) < 2 {
			t.Fatalf("threads of %d: %v, %v", p.PID, tasks, err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &set); err != nil {
				continue // the thread ended
			}
			if set.Count() != 1 || !set.IsSet(0) {
				t.Errorf("thread %d of %d not pinned to cpu 0", tid, p.PID)
			}
		}
	}
	if math.Abs(total-res.ServerCPUSeconds) > 1e-9 {
		t.Errorf("server CPU %v is not the processes' sum %v", res.ServerCPUSeconds, total)
	}
	if !strings.Contains(res.String(), "server pid") {
		t.Errorf("summary lacks the per-process lines:\n%s", res)
	}
}
