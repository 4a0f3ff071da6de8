package loadgen

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess sets the CPU affinity of every thread of process pid (0: this process) to cpus.
// sched_setaffinity acts on one thread, and a Go process has several; a thread started later
// inherits the affinity of the thread that starts it, so once all are pinned the process stays
// pinned. Threads can start while the list is walked: it is walked until it holds no new one.
func pinProcess(pid int, cpus CPUList) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	dir := "/proc/self/task"
	if pid != 0 {
		dir = fmt.Sprintf("/proc/%d/task", pid)
	}
	done := map[int]bool{}
	for {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh++
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH { // ESRCH: the thread ended
				return err
			}
			done[tid] = true
		}
		if fresh == 0 {
			return nil
		}
	}
}

// processCPUs is the CPU affinity of process pid (0: this process), as its main thread has it.
func processCPUs(pid int) (CPUList, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil, err
	}
	var cpus CPUList
	for c := range maxCPU {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
