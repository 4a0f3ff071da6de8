package console_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// get calls GET path of the cluster with key and decodes the JSON answer into out.
func get(t *testing.T, c *devcluster.Cluster, path, key string, out any) int {
	t.Helper()
	return testcluster.Call(t, c, http.MethodGet, path, key, "", out)
}

type roomsAnswer struct {
	App   string `json:"app"`
	Rooms []struct {
		Room    string           `json:"room"`
		Online  int64            `json:"online"`
		Nodes   map[string]int64 `json:"nodes"`
		CdnMode string           `json:"cdn_mode"`
	} `json:"rooms"`
}

type seriesAnswer struct {
	WindowMs int64   `json:"window_ms"`
	FlowT1   float64 `json:"flow_t1"`
	FlowT2   float64 `json:"flow_t2"`
	Nodes    map[string][]struct {
		T           int64 `json:"t"`
		Connections int64 `json:"connections"`
		Lanes       map[string]struct {
			Deliveries float64 `json:"deliveries"`
		} `json:"lanes"`
	} `json:"nodes"`
}

// TestConsoleEndpoints: the JSON endpoints refuse a request without a key or without the admin
// scope as the server API does, and with it show both nodes, the app's busy room with its
// members on each node and its CDN mode, and each node's recent reports.
func TestConsoleEndpoints(t *testing.T) {
	t.Parallel()
	keys := auth.APIKeys{
		"admin-key":   {App: devcluster.App, Scopes: []string{"admin"}},
		"read-key":    {App: devcluster.App, Scopes: []string{"read", "moderate"}},
		"other-admin": {App: "other", Scopes: []string{"admin"}},
		"send-key":    {App: devcluster.App, Scopes: []string{"send"}},
	}
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.API.Keys = keys
		cfg.LeaseInterval = 200 * time.Millisecond
	})

	// The page itself needs no key: it asks for one.
	resp, err := http.Get(c.URL() + "/console")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Roomcast ops console") {
		t.Fatalf("GET /console: %d %.100s", resp.StatusCode, page)
	}

	for _, path := range []string{"/v1/console/nodes", "/v1/console/rooms", "/v1/console/series"} {
		for _, tc := range []struct {
			key  string
			code int
			name string
		}{{"", 401, "UNAUTHORIZED"}, {"nope", 401, "UNAUTHORIZED"}, {"read-key", 403, "FORBIDDEN"}} {
			var e struct {
				Code  uint32 `json:"code"`
				Name  string `json:"name"`
				Error string `json:"error"`
			}
			if code := get(t, c, path, tc.key, &e); code != tc.code || !strings.HasSuffix(e.Name, tc.name) || e.Error == "" {
				t.Errorf("GET %s with key %q: %d %+v, want %d %s", path, tc.key, code, e, tc.code, tc.name)
			}
		}
	}

	// Three members of "busy" on one node, two on the other; one in "quiet".
	for i := range 6 {
		room := "busy"
		if i == 5 {
			room = "quiet"
		}
		cl := testkit.DialTCP(t, c.Nodes[i%2].TCPAddr())
		if f := cl.LoginAs(testcluster.Token(t, fmt.Sprintf("u%d", i), room), "web"); f.GetLoginAck() == nil {
			t.Fatalf("login: %v", f)
		}
	}

	var nodes struct {
		Nodes []struct {
			Node   string `json:"node"`
			Region string `json:"region"`
			Report *struct {
				Connections int64 `json:"connections"`
				Lanes       []struct {
					Lane       string `json:"lane"`
					Deliveries int64  `json:"deliveries"`
				} `json:"lanes"`
			} `json:"report"`
		} `json:"nodes"`
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if code := get(t, c, "/v1/console/nodes", "admin-key", &nodes); code != 200 {
			return fmt.Errorf("nodes: %d", code)
		}
		total := int64(0)
		for _, n := range nodes.Nodes {
			if n.Report != nil {
				total += n.Report.Connections
			}
		}
		if len(nodes.Nodes) != 2 || total != 6 {
			return fmt.Errorf("nodes: %+v, want 2 nodes with 6 connections", nodes)
		}
		return nil
	})

	var rooms roomsAnswer
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if code := get(t, c, "/v1/console/rooms", "admin-key", &rooms); code != 200 {
			return fmt.Errorf("rooms: %d", code)
		}
		if rooms.App != devcluster.App || len(rooms.Rooms) != 2 || rooms.Rooms[0].Room != "busy" || rooms.Rooms[0].Online != 5 ||
			len(rooms.Rooms[0].Nodes) != 2 || rooms.Rooms[1].Room != "quiet" || rooms.Rooms[1].Online != 1 {
			return fmt.Errorf("rooms: %+v, want busy (5 on 2 nodes) then quiet (1)", rooms)
		}
		return nil
	})
	if want := clientpb.CdnMode_CDN_MODE_OFF.String(); rooms.Rooms[0].CdnMode != want {
		t.Errorf("busy's CDN mode %q, want %q", rooms.Rooms[0].CdnMode, want)
	}

	// Another app's admin key sees none of these rooms.
	var other roomsAnswer
	if code := get(t, c, "/v1/console/rooms", "other-admin", &other); code != 200 || other.App != "other" || len(other.Rooms) != 0 {
		t.Errorf("other app's rooms: %d %+v, want none", code, other)
	}

	// The series grow with each report and end at the connections reported.
	var first, later seriesAnswer
	get(t, c, "/v1/console/series", "admin-key", &first)
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		get(t, c, "/v1/console/series", "admin-key", &later)
		if len(later.Nodes) != 2 || later.WindowMs != (5*time.Minute).Milliseconds() ||
			later.FlowT1 != chatlink.DefaultFlowT1 || later.FlowT2 != chatlink.DefaultFlowT2 {
			return fmt.Errorf("series: %d nodes, window %d, T1 %v, T2 %v", len(later.Nodes), later.WindowMs, later.FlowT1, later.FlowT2)
		}
		total := int64(0)
		for name, s := range later.Nodes {
			if len(s) <= len(first.Nodes[name]) {
				return fmt.Errorf("node %s: %d samples, no more than %d before", name, len(s), len(first.Nodes[name]))
			}
			total += s[len(s)-1].Connections
		}
		if total != 6 {
			return fmt.Errorf("last samples sum to %d connections, want 6", total)
		}
		return nil
	})

	// Critical messages to busy: its five members' deliveries show in the nodes' report counts,
	// and as a rate of critical deliveries in the series.
	for i := range 3 {
		if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/busy/messages", "send-key",
			fmt.Sprintf(`{"body":"m%d","lane":"critical"}`, i), nil); code != http.StatusOK {
			t.Fatalf("send: HTTP %d", code)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		get(t, c, "/v1/console/nodes", "admin-key", &nodes)
		total := int64(0)
		for _, n := range nodes.Nodes {
			if n.Report == nil || len(n.Report.Lanes) != 3 || n.Report.Lanes[0].Lane != "critical" {
				return fmt.Errorf("node %s's report lanes: %+v, want critical, normal, bulk", n.Node, n.Report)
			}
			total += n.Report.Lanes[0].Deliveries
		}
		if total != 15 {
			return fmt.Errorf("nodes report %d critical deliveries, want 15 (3 messages to 5 members)", total)
		}
		get(t, c, "/v1/console/series", "admin-key", &later)
		rate := 0.0
		for _, s := range later.Nodes {
			for _, sample := range s {
				rate += sample.Lanes["critical"].Deliveries
			}
		}
		if rate == 0 {
			return errors.New("no critical deliveries per second in the series")
		}
		return nil
	})
}
