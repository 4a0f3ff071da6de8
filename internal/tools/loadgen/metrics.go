package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// sample is one metric sample of the Prometheus text format: name{labels} value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the Prometheus text exposition format. Comments, blank lines and lines it
// cannot read are skipped: a scrape is for figures, and a stray line must not spoil it.
func parseMetrics(text string) []sample {
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if s, ok := parseSampleLine(sc.Text()); ok {
			out = append(out, s)
		}
	}
	return out
}

// parseSampleLine reads `name{a="x",b="y"} value [timestamp]`.
func parseSampleLine(line string) (sample, bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return sample{}, false
	}
	var s sample
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return sample{}, false
	}
	s.name, line = line[:i], line[i:]
	if line[0] == '{' {
		labels, rest, ok := parseLabels(line[1:])
		if !ok {
			return sample{}, false
		}
		s.labels, line = labels, rest
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return sample{}, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return sample{}, false
	}
	s.value = v
	return s, true
}

// parseLabels reads `a="x",b="y"}` and returns the labels and what follows the brace.
func parseLabels(s string) (map[string]string, string, bool) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t,")
		if s == "" {
			return nil, "", false
		}
		if s[0] == '}' {
			return labels, s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, "", false
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var val strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			if c == '"' {
				s = s[i+1:]
				closed = true
				break
			}
			val.WriteByte(c)
		}
		if !closed {
			return nil, "", false
		}
		labels[name] = val.String()
	}
}

// sum adds the values of every sample named name whose labels include all of match.
func sum(samples []sample, name string, match map[string]string) (float64, bool) {
	var total float64
	found := false
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			total += s.value
			found = true
		}
	}
	return total, found
}

// Names of the standard process metrics and of the ChatLink metrics the bench reads.
const (
	metricRSS        = "process_resident_memory_bytes"
	metricCPU        = "process_cpu_seconds_total"
	metricDeliveries = "roomcast_chatlink_deliveries_total"
	metricDrops      = "roomcast_chatlink_drops_total"
	metricConns      = "roomcast_chatlink_connections"
	metricCloses     = "roomcast_chatlink_closes_total"
	metricGoroutines = "go_goroutines"
	// The room service's: send requests answered (op="send", every code), and bulk messages its
	// rooms' caps left out.
	metricRoomRequests    = "roomcast_room_requests_total"
	metricRoomBulkSampled = "roomcast_room_bulk_sampled_out_total"
	metricHeapInuse       = "go_memstats_heap_inuse_bytes"
	metricStackInuse      = "go_memstats_stack_inuse_bytes"
)

// serverStats is what the bench reads of the server at one moment.
type serverStats struct {
	rss        float64            // bytes
	cpu        float64            // seconds of user+system time
	deliveries float64            // messages written to client connections, all lanes
	drops      map[string]float64 // by "lane/reason"
	slowCloses float64            // connections closed as slow readers
	conns      float64
	// The room service's send requests answered and bulk messages sampled out (bench upload).
	roomSends, roomSampled float64
	// Go runtime figures, when the server is a Go program that exports them (0 otherwise).
	goroutines, heapInuse, stackInuse float64
	// procs are the server's processes read from /proc, in the order of --pid; rss and cpu
	// are then their sums.
	procs []procStats
}

// procStats is one server process at one moment.
type procStats struct {
	pid      int
	rss, cpu float64 // bytes; seconds of user+system time
}

// probeServer reads the server's figures: from /metrics, and RSS and CPU from /proc, summed
// over its processes, when pids are set.
type probeServer struct {
	metricsURL string
	pids       []int
	hc         *http.Client
}

func (p probeServer) read(ctx context.Context) (serverStats, error) {
	st := serverStats{drops: map[string]float64{}, rss: math.NaN(), cpu: math.NaN()}
	if p.metricsURL != "" {
		text, err := p.scrape(ctx)
		if err != nil {
			if len(p.pids) == 0 {
				return st, err
			}
		} else {
			samples := parseMetrics(text)
			if v, ok := sum(samples, metricRSS, nil); ok {
				st.rss = v
			}
			if v, ok := sum(samples, metricCPU, nil); ok {
				st.cpu = v
			}
			st.deliveries, _ = sum(samples, metricDeliveries, nil)
			st.conns, _ = sum(samples, metricConns, nil)
			st.roomSends, _ = sum(samples, metricRoomRequests, map[string]string{"op": "send"})
			st.roomSampled, _ = sum(samples, metricRoomBulkSampled, nil)
			st.slowCloses, _ = sum(samples, metricCloses, map[string]string{"code": "CLOSE_CODE_SLOW_READER"})
			st.goroutines, _ = sum(samples, metricGoroutines, nil)
			st.heapInuse, _ = sum(samples, metricHeapInuse, nil)
			st.stackInuse, _ = sum(samples, metricStackInuse, nil)
			for _, s := range samples {
				if s.name == metricDrops {
					st.drops[s.labels["lane"]+"/"+s.labels["reason"]] += s.value
				}
			}
		}
	}
	if len(p.pids) > 0 {
		procs, err := readProcs(p.pids)
		if err != nil {
			return st, err
		}
		st.procs = procs
		st.rss, st.cpu = sumProcs(procs)
	}
	if math.IsNaN(st.rss) || math.IsNaN(st.cpu) {
		return st, fmt.Errorf("bench: %s has no %s or %s; use --pid", p.metricsURL, metricRSS, metricCPU)
	}
	return st, nil
}

// readProcs reads RSS and CPU time of each process in pids.
func readProcs(pids []int) ([]procStats, error) {
	procs := make([]procStats, 0, len(pids))
	for _, pid := range pids {
		rss, err := procRSS(pid)
		if err != nil {
			return nil, err
		}
		cpu, err := procCPU(pid)
		if err != nil {
			return nil, err
		}
		procs = append(procs, procStats{pid: pid, rss: rss, cpu: cpu})
	}
	return procs, nil
}

// sumProcs adds up the processes' RSS and CPU time: a fleet's footprint and cost.
func sumProcs(procs []procStats) (rss, cpu float64) {
	for _, p := range procs {
		rss += p.rss
		cpu += p.cpu
	}
	return rss, cpu
}

// maxMetricsBody bounds a scrape.
const maxMetricsBody = 16 << 20

func (p probeServer) scrape(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL, nil)
	if err != nil {
		return "", fmt.Errorf("bench: metrics: %w", err)
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return "", fmt.Errorf("bench: metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("bench: metrics: %s", resp.Status)
	}
	return string(b), nil
}

// procRSS reads VmRSS of process pid, in bytes.
func procRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return parseVmRSS(string(b))
}

func parseVmRSS(status string) (float64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("bench: unexpected VmRSS line %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("bench: VmRSS: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("bench: no VmRSS in /proc/PID/status")
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// procCPU reads utime+stime of process pid, in seconds.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return parseProcStat(string(b))
}

func parseProcStat(stat string) (float64, error) {
	// The command name (field 2) is in parentheses and may hold spaces; count from after it.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: malformed /proc/PID/stat")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: short /proc/PID/stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: malformed utime/stime in /proc/PID/stat")
	}
	return (ut + st) / clockTicks, nil
}
