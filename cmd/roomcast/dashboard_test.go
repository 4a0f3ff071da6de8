package main

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/testkit/testcluster"
)

// dashboardPanel is what the test reads of a Grafana panel.
type dashboardPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		W, X int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// metricName matches the metric names in a PromQL expression: ours and the Go runtime's and
// process's. Label names and functions do not start with these prefixes.
var metricName = regexp.MustCompile(`\b(?:roomcast|process|go)_[a-z0-9_]+\b`)

// registered reports whether reg holds a collector of the metric family name: registering
// another under the same name then fails. Families with labels count before their first
// sample, which a scrape would not show.
func registered(reg *prometheus.Registry, name string) bool {
	c := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "dashboard test probe"})
	if err := reg.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		return errors.As(err, &dup) || strings.Contains(err.Error(), "previously registered")
	}
	reg.Unregister(c)
	return false
}

// TestDeployGrafana checks deploy/grafana/roomcast.json: it parses as a dashboard whose panels
// fit the grid and have queries, and every metric its queries name is one the roles register
// (a dev assembly: the services, two ChatLinks and a CDN pusher on one registry).
func TestDeployGrafana(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../deploy/grafana/roomcast.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string           `json:"title"`
		UID        string           `json:"uid"`
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("deploy/grafana/roomcast.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Templating.List) == 0 || dash.Templating.List[0].Type != "datasource" {
		t.Fatalf("dashboard %q (uid %q) wants a title, a uid and a datasource variable", dash.Title, dash.UID)
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	ids := map[int]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q does not fit the 24-column grid: x %d w %d", p.Title, p.GridPos.X, p.GridPos.W)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			names := metricName.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric", p.Title, q.Expr)
			}
			for _, name := range names {
				family := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if f, ok := strings.CutSuffix(name, suffix); ok && registered(c.Registry, f) {
						family = f
					}
				}
				if !registered(c.Registry, family) {
					t.Errorf("panel %q: query %q names %s, which no role registers", p.Title, q.Expr, name)
				}
			}
			queries++
		}
	}
	if queries < 20 {
		t.Errorf("the dashboard has %d queries; want the roles' main metrics (20 or more)", queries)
	}
}
