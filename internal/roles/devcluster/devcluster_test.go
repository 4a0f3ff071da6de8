package devcluster

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"roomcast/proto/dispatcherpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func getJSON(t *testing.T, url string, into any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}

// The dispatcher as the dev cluster wires it: HTTP and gRPC dispatch, the admin view fed by
// the ChatLinks' real load reports, and its state in /healthz.
func TestDispatcherWiring(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{DataDir: t.TempDir(), ChatLinks: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	var health struct {
		Status     string
		Chatlinks  int
		Dispatcher struct{ Mode string }
	}
	if code := getJSON(t, c.URL()+"/healthz", &health); code != 200 || health.Status != "ok" ||
		health.Chatlinks != 2 || health.Dispatcher.Mode != "load-only" {
		t.Fatalf("healthz %d %+v: want ok, 2 chatlinks, load-only", code, health)
	}

	var ans struct {
		Nodes []struct {
			Node, WSURL, TCPAddr string
		}
		TTLMS int64 `json:"ttl_ms"`
	}
	if code := getJSON(t, c.URL()+"/v1/dispatch?app=demo&room=r&uid=u", &ans); code != 200 || len(ans.Nodes) != 2 || ans.TTLMS != 30000 {
		t.Fatalf("dispatch %d %+v", code, ans)
	}

	var admin struct {
		Nodes []struct {
			Node   string
			Report struct {
				BusRTTUs         int64 `json:"bus_rtt_us"`
				ReportIntervalMs int64 `json:"report_interval_ms"`
			}
		}
	}
	if code := getJSON(t, c.URL()+"/v1/nodes", &admin); code != 200 || len(admin.Nodes) != 2 {
		t.Fatalf("nodes %d %+v", code, admin)
	}
	for _, n := range admin.Nodes {
		if n.Report.BusRTTUs <= 0 || n.Report.ReportIntervalMs != 1000 {
			t.Fatalf("node %s reports RTT %dµs, interval %dms: want both measured", n.Node, n.Report.BusRTTUs, n.Report.ReportIntervalMs)
		}
	}

	conn, err := grpc.NewClient(c.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := dispatcherpb.NewDispatcherClient(conn).Dispatch(ctx, &dispatcherpb.DispatchRequest{App: App, Room: "r", Uid: "u"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{c.Nodes[0].WSURL(): true, c.Nodes[1].WSURL(): true}
	for _, e := range resp.Nodes {
		if !want[e.WsUrl] {
			t.Fatalf("gRPC answer %v: unknown endpoint %s", resp, e.WsUrl)
		}
		delete(want, e.WsUrl)
	}
	if len(want) != 0 {
		t.Fatalf("gRPC answer %v: missing %v", resp, want)
	}
}
