package loadgen

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CPUList is a set of CPU numbers in the kernel's list syntax ("0", "1-3", "0,2-3"), as
// taskset -c and /sys/devices/system/cpu/online write them. It is a flag.Value.
type CPUList []int

// maxCPU bounds a CPU number: the size of the kernel's default cpu_set_t.
const maxCPU = 1024

// Set parses s, replacing the list.
func (l *CPUList) Set(s string) error {
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := parseCPU(lo)
		if err != nil {
			return fmt.Errorf("cpu list %q: %w", s, err)
		}
		last := first
		if isRange {
			if last, err = parseCPU(hi); err != nil {
				return fmt.Errorf("cpu list %q: %w", s, err)
			}
			if last < first {
				return fmt.Errorf("cpu list %q: range %s runs backwards", s, part)
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	*l = slices.Compact(cpus)
	return nil
}

func parseCPU(s string) (int, error) {
	c, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || c < 0 || c >= maxCPU {
		return 0, fmt.Errorf("%q is not a CPU number (0 to %d)", s, maxCPU-1)
	}
	return c, nil
}

// String writes the list in the kernel's syntax, ranges folded: "0-2,5".
func (l CPUList) String() string {
	var b strings.Builder
	for i := 0; i < len(l); {
		j := i
		for j+1 < len(l) && l[j+1] == l[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(l[i]))
		if j > i {
			fmt.Fprintf(&b, "-%d", l[j])
		}
		i = j + 1
	}
	return b.String()
}

// PIDList is a comma-separated list of process ids: the processes of one server (a roomcast
// dev, or a fleet of ChatLinks and what serves them). It is a flag.Value.
type PIDList []int

// Set parses s, replacing the list. A pid may be named once.
func (l *PIDList) Set(s string) error {
	var pids []int
	for part := range strings.SplitSeq(s, ",") {
		pid, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || pid <= 0 {
			return fmt.Errorf("pid list %q: %q is not a process id", s, part)
		}
		if slices.Contains(pids, pid) {
			return fmt.Errorf("pid list %q: %d named twice", s, pid)
		}
		pids = append(pids, pid)
	}
	*l = pids
	return nil
}

func (l PIDList) String() string {
	parts := make([]string, len(l))
	for i, pid := range l {
		parts[i] = strconv.Itoa(pid)
	}
	return strings.Join(parts, ",")
}

// Placement is where the run's two sides ran: the CPUs the bench and each server process were
// allowed (their affinity as the run found it, after any pinning), and what each server
// process used. A latency figure means something only when the sides had CPUs of their own.
type Placement struct {
	// BenchCPUs is the bench process's affinity; its worker processes inherit it.
	BenchCPUs string `json:"bench_cpus"`
	// ServerProcesses is one entry per --pid, empty when the server is read from /metrics.
	ServerProcesses []ProcessUsage `json:"server_processes,omitempty"`
}

// ProcessUsage is one server process over the run.
type ProcessUsage struct {
	PID        int     `json:"pid"`
	CPUs       string  `json:"cpus"`        // its affinity
	CPUSeconds float64 `json:"cpu_seconds"` // user+system time over the measured window
	RSSBytes   float64 `json:"rss_bytes"`   // resident memory at the window's end
}

// placement fills a Placement from the server's figures at the two ends of the measured
// window.
func (r *runner) placement(before, after serverStats) Placement {
	p := Placement{BenchCPUs: "?"}
	if cpus, err := processCPUs(0); err == nil {
		p.BenchCPUs = cpus.String()
	}
	for i, proc := range after.procs {
		u := ProcessUsage{PID: proc.pid, CPUs: "?", RSSBytes: proc.rss, CPUSeconds: proc.cpu}
		if i < len(before.procs) && before.procs[i].pid == proc.pid {
			u.CPUSeconds = proc.cpu - before.procs[i].cpu
		}
		if cpus, err := processCPUs(proc.pid); err == nil {
			u.CPUs = cpus.String()
		}
		p.ServerProcesses = append(p.ServerProcesses, u)
	}
	return p
}

// summary is the placement's lines of a result's summary.
func (p Placement) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  cpus        bench %s", p.BenchCPUs)
	switch len(p.ServerProcesses) {
	case 0:
		b.WriteString(", server unknown (give --pid)")
	case 1:
		fmt.Fprintf(&b, ", server %s (pid %d)", p.ServerProcesses[0].CPUs, p.ServerProcesses[0].PID)
	default:
		var cpu, rss float64
		for _, u := range p.ServerProcesses {
			fmt.Fprintf(&b, "\n  server pid  %-8d cpus %-6s %8.2f CPU-s  RSS %6.0f MiB", u.PID, u.CPUs, u.CPUSeconds, u.RSSBytes/(1<<20))
			cpu += u.CPUSeconds
			rss += u.RSSBytes
		}
		fmt.Fprintf(&b, "\n  server      %d processes %8.2f CPU-s  RSS %6.0f MiB", len(p.ServerProcesses), cpu, rss/(1<<20))
	}
	return b.String()
}

// pin sets the affinity of the bench (this process, and so the worker processes it starts
// later) and of the server's processes, as the Config asks.
func (r *runner) pin() error {
	if len(r.cfg.BenchCPUs) > 0 {
		if err := pinProcess(0, r.cfg.BenchCPUs); err != nil {
			return fmt.Errorf("bench: --bench-cpus %s: %w", r.cfg.BenchCPUs, err)
		}
	}
	if len(r.cfg.ServerCPUs) > 0 {
		for _, pid := range r.cfg.PIDs {
			if err := pinProcess(pid, r.cfg.ServerCPUs); err != nil {
				return fmt.Errorf("bench: --server-cpus %s for pid %d: %w", r.cfg.ServerCPUs, pid, err)
			}
		}
	}
	if len(r.cfg.BenchCPUs) > 0 || len(r.cfg.ServerCPUs) > 0 {
		// A Go process (the server, this one) fits GOMAXPROCS to its CPUs within a second of
		// their change; until then it runs more threads than it has CPUs, which costs.
		time.Sleep(repinSettle)
	}
	return nil
}

// repinSettle is how long a run waits after pinning before it measures.
const repinSettle = 1500 * time.Millisecond
