package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"roomcast/internal/testkit/testcluster"
)

// recordedName matches a recording rule's name (level:metric:operations): the colons tell it
// from an exported metric, which has none.
var recordedName = regexp.MustCompile(`\b[a-z_]+:[a-z0-9_:]+\b`)

// alertName matches the name of one of our alerts in docs/operations.md and docs/security.md.
var alertName = regexp.MustCompile(`\bRoomcast[A-Z][A-Za-z0-9]+\b`)

// TestDeployPrometheusRules checks deploy/prometheus/roomcast.rules.yml against the code and the
// docs (promtool checks its syntax and runs its unit tests: make rules-check): every metric its
// expressions name is one the roles register, every recorded series it uses is recorded in it,
// and the alerts the docs name are its alerts, and the reverse.
func TestDeployPrometheusRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../deploy/prometheus/roomcast.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct{ Record, Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatalf("roomcast.rules.yml: %v", err)
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	// What runChatLink and runServices add to their role's registry: the reload watcher's.
	w, err := startReload(flag.NewFlagSet("chatlink", flag.ContinueOnError), nil, c.Registry, func() error { return nil }, func() []string { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	recorded, alerts := map[string]bool{}, map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			if r.Alert != "" {
				if alerts[r.Alert] {
					t.Errorf("alert %s defined twice", r.Alert)
				}
				alerts[r.Alert] = true
			}
		}
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			rule := r.Record + r.Alert
			for _, name := range recordedName.FindAllString(r.Expr, -1) {
				if !recorded[name] {
					t.Errorf("rule %s: %s is recorded by no rule", rule, name)
				}
			}
			names := metricName.FindAllString(recordedName.ReplaceAllString(r.Expr, ""), -1)
			if len(names) == 0 && !strings.Contains(r.Expr, ":") && !strings.Contains(r.Expr, "up{") {
				t.Errorf("rule %s: %q names no metric", rule, r.Expr)
			}
			for _, name := range names {
				family := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if f, ok := strings.CutSuffix(name, suffix); ok && registered(c.Registry, f) {
						family = f
					}
				}
				if !registered(c.Registry, family) {
					t.Errorf("rule %s: %q names %s, which no role registers", rule, r.Expr, name)
				}
			}
		}
	}
	if len(alerts) < 30 {
		t.Errorf("the rules hold %d alerts; want every alert of docs/operations.md and docs/security.md", len(alerts))
	}
	documented := map[string]bool{}
	for _, d := range readDocs(t) {
		if d.name != "docs/operations.md" && d.name != "docs/security.md" { // other docs' Roomcast names are types
			continue
		}
		for i, line := range strings.Split(d.text, "\n") {
			for _, name := range alertName.FindAllString(line, -1) {
				documented[name] = true
				if !alerts[name] {
					t.Errorf("%s:%d: alert %s is not in deploy/prometheus/roomcast.rules.yml", d.name, i+1, name)
				}
			}
		}
	}
	for name := range alerts {
		if !documented[name] {
			t.Errorf("alert %s of deploy/prometheus/roomcast.rules.yml is named in no doc", name)
		}
	}
}
