package loadgen

import (
	"context"
	"math"
	"net"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	samples := parseMetrics(string(b))
	for _, tc := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{metricRSS, nil, 6.3905792e+07},
		{metricCPU, nil, 12.34},
		{metricDeliveries, nil, 1500 + 20 + 3},
		{metricDeliveries, map[string]string{"lane": "critical"}, 1500},
		{metricDeliveries, map[string]string{"lane": "critical", "node": "cl-2"}, 0},
		{metricDrops, map[string]string{"reason": "slow_reader"}, 7},
		{metricConns, nil, 300},
		{"weird_label", map[string]string{"path": `a"b\c` + "\n"}, 1},
	} {
		got, ok := sum(samples, tc.name, tc.match)
		if tc.want != 0 && !ok {
			t.Errorf("%s%v: not found", tc.name, tc.match)
		}
		if got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
	if _, ok := sum(samples, "roomcast_missing", nil); ok {
		t.Error("found a metric that is not there")
	}
}

func TestParseSampleLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line string
		want sample
		ok   bool
	}{
		{"up 1", sample{name: "up", value: 1}, true},
		{"x{a=\"1\"} 2.5e3 1700000000000", sample{name: "x", labels: map[string]string{"a": "1"}, value: 2500}, true},
		{"x{} +Inf", sample{name: "x", labels: map[string]string{}, value: math.Inf(1)}, true},
		{"# HELP x y", sample{}, false},
		{"", sample{}, false},
		{"x{a=\"1\" 2", sample{}, false},
		{"x{a=1} 2", sample{}, false},
		{"x two", sample{}, false},
		{"{a=\"1\"} 2", sample{}, false},
	} {
		got, ok := parseSampleLine(tc.line)
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("parseSampleLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseMetrics(f *testing.F) {
	b, err := os.ReadFile("testdata/metrics.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add("x{a=\"\\\"\"} 1")
	f.Fuzz(func(t *testing.T, text string) {
		for _, s := range parseMetrics(text) {
			if s.name == "" {
				t.Fatalf("sample without a name from %q", text)
			}
		}
	})
}

func TestParseProc(t *testing.T) {
	t.Parallel()
	rss, err := parseVmRSS("Name:\troomcast\nVmPeak:\t  900 kB\nVmRSS:\t   61234 kB\nThreads: 9\n")
	if err != nil || rss != 61234*1024 {
		t.Errorf("parseVmRSS = %v, %v", rss, err)
	}
	if _, err := parseVmRSS("Name: x\n"); err == nil {
		t.Error("parseVmRSS accepted a status without VmRSS")
	}
	// The command name may hold spaces and parentheses.
	stat := "4242 (road (runner) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 9 0 100 1000000 5000 18446744073709551615"
	cpu, err := parseProcStat(stat)
	if err != nil || cpu != 3.8 {
		t.Errorf("parseProcStat = %v, %v; want 3.8", cpu, err)
	}
	if _, err := parseProcStat("4242 (x) S 1 2"); err == nil {
		t.Error("parseProcStat accepted a short line")
	}
	// And this process, for real.
	if rss, err := procRSS(os.Getpid()); err != nil || rss <= 0 {
		t.Errorf("procRSS(self) = %v, %v", rss, err)
	}
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Errorf("procCPU(self): %v", err)
	}
}

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n, per int
		want   []int
	}{
		{0, 10, nil},
		{5, 10, []int{5}},
		{18000, 18000, []int{18000}},
		{18001, 18000, []int{9001, 9000}},
		{40000, 18000, []int{13334, 13333, 13333}},
		{20, 8, []int{7, 7, 6}},
		{3, 0, []int{1, 1, 1}},
	} {
		got := split(tc.n, tc.per)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("split(%d, %d) = %v, want %v", tc.n, tc.per, got, tc.want)
		}
		total := 0
		for _, p := range got {
			total += p
			if p > max(tc.per, 1) {
				t.Errorf("split(%d, %d): part %d over the limit", tc.n, tc.per, p)
			}
		}
		if total != tc.n {
			t.Errorf("split(%d, %d) adds up to %d", tc.n, tc.per, total)
		}
	}
}

func TestSourceAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		i    int
		want string
	}{
		{0, "127.0.0.1"},
		{clientsPerSourceAddr - 1, "127.0.0.1"},
		{clientsPerSourceAddr, "127.0.0.2"},
		{250 * clientsPerSourceAddr, "127.0.1.1"},
	} {
		if got := sourceAddr(tc.i).String(); got != tc.want {
			t.Errorf("sourceAddr(%d) = %s, want %s", tc.i, got, tc.want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:80": true, "127.9.9.9:1": true, "10.0.0.1:80": false, "example.com:80": false, "[::1]:80": false, "bad": false} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v", addr, got)
		}
	}
	// A dialer bound to 127.0.0.3 really dials from there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := DialerFrom(net.IPv4(127, 0, 0, 3))(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !strings.HasPrefix(nc.LocalAddr().String(), "127.0.0.3:") {
		t.Errorf("dialed from %s", nc.LocalAddr())
	}
}

func TestBody(t *testing.T) {
	t.Parallel()
	run := runID{1, 2, 3, 4}
	now := time.Now().UnixNano()
	b := appendBody(nil, run, 77, now, 64)
	if len(b) != 64 {
		t.Errorf("body is %d bytes, want 64", len(b))
	}
	seq, sent, ok := parseBody(b, run)
	if !ok || seq != 77 || sent != now {
		t.Errorf("parseBody = %d, %d, %v", seq, sent, ok)
	}
	if _, _, ok := parseBody(b, runID{9}); ok {
		t.Error("a body of another run was taken")
	}
	if _, _, ok := parseBody([]byte("hello, room"), run); ok {
		t.Error("a chat message was taken for a bench body")
	}
	if got := len(appendBody(nil, run, 1, now, 1)); got != bodyHeader {
		t.Errorf("a body smaller than the header is %d bytes", got)
	}
}

func TestMemberReceiveCountsDuplicates(t *testing.T) {
	t.Parallel()
	f := newFleet(spec{Run: runID{7}}, nil)
	m := &member{f: f}
	run := runID{7}
	msg := func(seq uint64) []byte { return appendBody(nil, run, seq, time.Now().UnixNano(), 24) }
	for _, seq := range []uint64{0, 1, 1, 500, 0, 64} {
		m.receive(pbMessage(msg(seq)))
	}
	m.receive(pbMessage([]byte("not ours")))
	if m.distinct.Load() != 4 || m.dup != 2 {
		t.Errorf("distinct %d dup %d, want 4 and 2", m.distinct.Load(), m.dup)
	}
}

func TestBar(t *testing.T) {
	t.Parallel()
	if got := bar(5, 10); got != "[##########..........]" {
		t.Errorf("bar(5, 10) = %s", got)
	}
	if got := bar(20, 10); got != "[####################]" {
		t.Errorf("bar(20, 10) = %s", got)
	}
	if got := bar(1, 0); got != "[....................]" {
		t.Errorf("bar(1, 0) = %s", got)
	}
}

func pbMessage(body []byte) *clientpb.Message {
	return &clientpb.Message{Lane: clientpb.Lane_LANE_CRITICAL, Body: body}
}

// TestStartSpec checks that a run hands its settings to its workers.
func TestStartSpec(t *testing.T) {
	t.Parallel()
	cfg, err := Config{Dispatcher: "http://127.0.0.1:1", Secret: []byte("s"), N: 10, Rooms: 3, Transport: "tcp", Tags: 4}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.start("conns", 0, 16); err != nil {
		t.Fatal(err)
	}
	defer r.stop()
	sp := r.workers[0].(*localWorker).f.spec
	if sp.Rooms != 3 || sp.Count != 10 || sp.Transport != "tcp" || sp.Room != r.room || sp.Run != r.id || sp.MessageBuffer != 16 || sp.Tags != 4 {
		t.Errorf("worker spec %+v", sp)
	}
	rooms := map[string]bool{}
	for i := range 10 {
		rooms[sp.room(i)] = true
	}
	if len(rooms) != 3 || !rooms[r.room+"-0"] || !rooms[r.room+"-2"] {
		t.Errorf("10 clients over 3 rooms land in %v", rooms)
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	target := Config{Dispatcher: "http://127.0.0.1:8080/", Secret: []byte("s"), N: 1}
	with := func(edit func(*Config)) Config {
		c := target
		edit(&c)
		return c
	}
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: target, Check: func(t *testing.T, c Config) {
			if c.Dispatcher != "http://127.0.0.1:8080" || c.API != c.Dispatcher || c.Metrics != c.API+"/metrics" ||
				c.App != "demo" || c.Transport != sdk.TransportWebSocket || c.Rooms != 1 || c.Duration != 10*time.Second ||
				c.Lane != "critical" || c.Size != 64 || c.Senders != 16 || c.Wait != 10*time.Second || c.Pause != 3*time.Second ||
				c.Settle != 30*time.Second || c.Concurrency != 128 || c.PerProcess != DefaultPerProcess {
				t.Errorf("defaults not filled: %+v", c)
			}
		}},
		{Name: "senders follow the rate", Config: with(func(c *Config) { c.Rate = 400 }), Check: func(t *testing.T, c Config) {
			if c.Senders != 80 {
				t.Errorf("Senders = %d at 400/s, want 80", c.Senders)
			}
		}},
		{Name: "negative pause means none", Config: with(func(c *Config) { c.Pause = -1 }), Check: func(t *testing.T, c Config) {
			if c.Pause != -1 {
				t.Errorf("Pause = %v, want it left negative", c.Pause)
			}
		}},
		{Name: "no dispatcher", Config: with(func(c *Config) { c.Dispatcher = "" }), WantErr: "no dispatcher URL"},
		{Name: "no secret", Config: with(func(c *Config) { c.Secret = nil }), WantErr: "no app secret"},
		{Name: "no clients", Config: with(func(c *Config) { c.N = 0 }), WantErr: "n must be at least 1"},
		{Name: "bad transport", Config: with(func(c *Config) { c.Transport = "udp" }), WantErr: `unknown transport "udp"`},
		{Name: "bad client", Config: with(func(c *Config) { c.Client = "curl" }), WantErr: `unknown client "curl"`},
	})
}

func TestCPUList(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "0", want: "0"},
		{in: "1-3", want: "1-3"},
		{in: "5, 0,2-3", want: "0,2-3,5"},
		{in: "3,1,2,1", want: "1-3"},
		{in: "0-1,1-2", want: "0-2"},
		{in: "", err: true},
		{in: "a", err: true},
		{in: "3-1", err: true},
		{in: "-1", err: true},
		{in: "1,", err: true},
		{in: "1024", err: true},
	} {
		var l CPUList
		err := l.Set(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("Set(%q) error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if got := l.String(); !tc.err && got != tc.want {
			t.Errorf("Set(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPIDList(t *testing.T) {
	t.Parallel()
	var l PIDList
	if err := l.Set("42, 7,1000"); err != nil || l.String() != "42,7,1000" {
		t.Errorf("Set = %v, %v", l, err)
	}
	for _, bad := range []string{"", "0", "-3", "x", "4,4", "1,,2"} {
		if err := l.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if _, err := (Config{Dispatcher: "http://x", Secret: []byte("s"), N: 1, ServerCPUs: CPUList{0}}).withDefaults(); err == nil {
		t.Error("server CPUs without pids accepted")
	}
}

// TestFleetSums checks that the server's figures are a fleet's sums, and that the placement
// reports each process's own share of the window.
func TestFleetSums(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	p := probeServer{pids: []int{self, child.Process.Pid}}
	st, err := p.read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.procs) != 2 || st.procs[0].pid != self || st.procs[1].pid != child.Process.Pid {
		t.Fatalf("procs %+v", st.procs)
	}
	if st.procs[1].rss <= 0 || st.rss != st.procs[0].rss+st.procs[1].rss || st.cpu != st.procs[0].cpu+st.procs[1].cpu {
		t.Errorf("sums rss %v cpu %v of %+v", st.rss, st.cpu, st.procs)
	}
	if _, err := (probeServer{pids: []int{self, 1 << 30}}).read(context.Background()); err == nil {
		t.Error("a missing process was not an error")
	}

	before := serverStats{procs: []procStats{{pid: 10, cpu: 1, rss: 5}, {pid: 11, cpu: 2, rss: 6}}}
	after := serverStats{procs: []procStats{{pid: 10, cpu: 1.5, rss: 7 << 20}, {pid: 11, cpu: 4, rss: 9 << 20}}}
	var r runner
	pl := r.placement(before, after)
	if len(pl.ServerProcesses) != 2 || pl.ServerProcesses[0].CPUSeconds != 0.5 || pl.ServerProcesses[1].CPUSeconds != 2 ||
		pl.ServerProcesses[1].RSSBytes != 9<<20 || pl.ServerProcesses[1].PID != 11 {
		t.Errorf("placement %+v", pl)
	}
	if s := pl.summary(); !strings.Contains(s, "2 processes     2.50 CPU-s  RSS     16 MiB") {
		t.Errorf("summary %q lacks the fleet's total", s)
	}
}
