package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"roomcast/internal/testkit/testcluster"
)

// TestMain lets the test binary stand in for roomcast: as a bench worker process (`roomcast
// bench` starts os.Executable() with "bench worker", which in a test is this binary), and as
// the whole command when asMainEnv is set (startRoomcast).
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "worker" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv(asMainEnv) != "" {
		main()
	}
	os.Exit(m.Run())
}

// lastJSON decodes the last line of out as a JSON object.
func lastJSON(t *testing.T, out string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line of stdout is not JSON: %v\n%s", err, out)
	}
	return m
}

func TestBench(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	target := []string{"--dispatcher", c.URL(), "--json"}

	type scenario struct {
		name   string
		args   []string
		fields []string
	}
	runScenario := func(t *testing.T, tc scenario) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(append([]string{"bench"}, tc.args...), target...), &out, &errOut)
		t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		m := lastJSON(t, out.String())
		if m["scenario"] != tc.args[0] || m["n"] == nil {
			t.Errorf("JSON names scenario %v, n %v", m["scenario"], m["n"])
		}
		for _, f := range tc.fields {
			if _, ok := m[f]; !ok {
				t.Errorf("JSON lacks %q", f)
			}
		}
		if tc.args[0] == "fanout" && (m["expected"] != m["delivered"] || m["lost_critical"] != float64(0)) {
			t.Errorf("fanout lost messages on a healthy cluster: %v", m)
		}
	}
	// conns mostly waits (at least 4s) for the server's RSS to settle, with ten idle
	// members: it runs beside the others, which run one after another, so that no two loads
	// share the cluster.
	t.Run("conns", func(t *testing.T) {
		t.Parallel()
		runScenario(t, scenario{"conns", []string{"conns", "--n", "10", "--settle", "4s"}, []string{"rss_per_conn_bytes"}})
	})
	t.Run("load", func(t *testing.T) {
		t.Parallel()
		// Under -short (`make test`) the fan-outs start publishing 100ms after the joins, not
		// after the default 3s.
		var pause []string
		if testing.Short() {
			pause = []string{"--pause", "100ms"}
		}
		for _, tc := range []scenario{
			{"fanout", append([]string{"fanout", "--n", "10", "--rate", "20", "--duration", "1s", "--tick", "50ms", "--lane", "mix", "--progress"}, pause...),
				[]string{"deliveries_per_sec", "deliveries_per_server_cpu_sec", "expected", "delivered", "lost_critical", "p50_ms", "p99_ms", "max_ms"}},
			// A latency budget: every normal message still arrives, later and in fewer frames.
			{"fanout gathered", append([]string{"fanout", "--n", "10", "--rate", "20", "--duration", "1s", "--tick", "50ms", "--lane", "normal", "--latency-budget", "300ms"}, pause...),
				[]string{"latency_budget_ms", "lost", "p99_ms"}},
			// Three worker processes, each started as `roomcast bench worker`.
			{"fanout workers", append([]string{"fanout", "--n", "10", "--rate", "10", "--duration", "1s", "--tick", "50ms", "--per-process", "4", "--transport", "tcp"}, pause...),
				[]string{"deliveries_per_server_cpu_sec", "lost_critical"}},
			{"login", []string{"login", "--n", "20", "--rate", "100"}, []string{"logins_per_sec", "p99_ms"}},
		} {
			t.Run(tc.name, func(t *testing.T) { runScenario(t, tc) })
		}
	})
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"bench"}, 2, "Scenarios:"},
		{[]string{"bench", "nonsense"}, 2, "unknown scenario"},
		{[]string{"bench", "fanout", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"bench", "conns", "extra"}, 2, "unexpected arguments"},
		{[]string{"bench", "login", "--help"}, 0, "logins/s"},
		{[]string{"bench", "cdn", "--help"}, 0, "origin requests per segment"},
		{[]string{"bench", "cdn", "--conns", "-1", "--dispatcher", "http://127.0.0.1:1"}, 1, "conns must be 1 to 4096"},
		{[]string{"bench", "fanout", "--tags", "class", "--dispatcher", "http://127.0.0.1:1"}, 2, "invalid value"},
		{[]string{"bench", "fanout", "--tags", "-1", "--dispatcher", "http://127.0.0.1:1"}, 1, "tags must be 0 (untargeted)"},
		{[]string{"bench", "fanout", "--tags", "-1", "--json", "--dispatcher", "http://127.0.0.1:1"}, 1, `"error":`},
		{[]string{"bench", "fanout", "--help"}, 0, "--tags G"},
		{[]string{"bench", "fanout", "--latency-budget", "1500us", "--dispatcher", "http://127.0.0.1:1"}, 1, "whole number of milliseconds"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s%s", tc.args, code, tc.code, tc.want, out.String(), errOut.String())
		}
	}
}
