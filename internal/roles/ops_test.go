package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/api"
	"roomcast/cdnpusher"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// status GETs url and returns the status code and the start of the body.
func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	return resp.StatusCode, string(b)
}

// startStoragelessPusher starts a pusher role whose storage is not there: its ops endpoint
// answers all the same. It stops when t ends.
func startStoragelessPusher(t *testing.T, natsURL string) *Pusher {
	t.Helper()
	cfg := PusherConfig{NATSURL: natsURL, OpsListen: "127.0.0.1:0"}
	cfg.Pusher.Pusher = cdnpusher.Config{Endpoint: "127.0.0.1:1", Bucket: "b"}
	p, err := StartPusher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// The ops endpoint of every role serves metrics, profiles, liveness and readiness (and the
// services' admin /v1/nodes) apart from the public endpoint, which serves neither metrics nor
// the admin routes unless PublicAdmin asks; readiness follows the NATS connection and a
// ChatLink's drain.
func TestOpsEndpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ns := startNATS(t, devnats.Config{StoreDir: dir})
	port := ns.Addr().(*net.TCPAddr).Port
	cfg := servicesConfig(ns.ClientURL())
	cfg.OpsListen = "127.0.0.1:0"
	svc, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	cfg.PublicAdmin, cfg.OpsListen = true, ""
	compat, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer compat.Close()
	cl, err := StartChatLink(chatLinkConfig(ns.ClientURL(), "edge-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Shutdown(context.Background()) }()
	pusher := startStoragelessPusher(t, ns.ClientURL())

	want := func(url string, code int, body string) {
		t.Helper()
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if got, b := status(t, url); got != code || !strings.Contains(b, body) {
				return fmt.Errorf("GET %s: %d %q, want %d with %q", url, got, b, code, body)
			}
			return nil
		})
	}
	ops := map[string]string{"services": "http://" + svc.OpsAddr(), "chatlink": "http://" + cl.OpsAddr(), "cdnpusher": "http://" + pusher.OpsAddr()}
	for _, url := range ops {
		want(url+"/metrics", 200, "# HELP go_")
		want(url+"/livez", 200, `"status":"ok"`)
		want(url+"/readyz", 200, `"status":"ok"`)
		want(url+"/healthz", 200, `"status":"ok"`)
		want(url+"/debug/pprof/", 200, "/debug/pprof/")
	}
	want(ops["services"]+"/v1/nodes", 200, "edge-a")
	want(svc.URL()+"/metrics", 404, "")
	want(svc.URL()+"/v1/nodes", 404, "")
	want(svc.URL()+"/debug/pprof/", 404, "")
	want(svc.URL()+"/healthz", 200, `"status":"ok"`) // load balancers check the public port
	want(compat.URL()+"/metrics", 200, "# HELP go_")
	want(compat.URL()+"/v1/nodes", 200, "edge-a")

	// Without NATS no role is ready, and all are alive.
	ns.Shutdown()
	ns.WaitForShutdown()
	for _, url := range ops {
		want(url+"/readyz", 503, "not connected to NATS")
		want(url+"/livez", 200, `"status":"ok"`)
	}
	startNATS(t, devnats.Config{Port: port, StoreDir: dir})
	for _, url := range ops {
		want(url+"/readyz", 200, `"status":"ok"`)
	}
	// A draining ChatLink takes no new clients: not ready.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { _ = cl.Node.Drain(ctx, 10*time.Millisecond) }()
	want(ops["chatlink"]+"/readyz", 503, "draining")
}

// A request no route takes is answered in JSON like the API's errors, on the public and the
// ops endpoint, with net/http's status: 404, or 405 and Allow.
func TestNoRouteJSON(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, devnats.Config{StoreDir: t.TempDir()})
	cfg := servicesConfig(ns.ClientURL())
	cfg.OpsListen = "127.0.0.1:0"
	svc, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	cases := []struct {
		method, url string
		status      int
		allow, msg  string
	}{
		{"GET", svc.URL() + "/v1/nothing", 404, "", "no route GET /v1/nothing"},
		{"DELETE", svc.URL() + "/v1/rooms/r", 405, "GET, HEAD, PATCH", "/v1/rooms/r does not take DELETE, only GET, HEAD, PATCH"},
		{"GET", svc.URL() + "/metrics", 404, "", "no route GET /metrics"},
		{"GET", "http://" + svc.OpsAddr() + "/nothing", 404, "", "no route GET /nothing"},
		{"POST", "http://" + svc.OpsAddr() + "/metrics", 405, "GET, HEAD", "/metrics does not take POST, only GET, HEAD"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, c.url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body api.ErrorBody
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/json" ||
			body.Code != 100 || body.Name != "BAD_REQUEST" || body.Error != c.msg || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d %q Allow %q %+v %v, want %d Allow %q and %q", c.method, c.url, resp.StatusCode,
				resp.Header.Get("Content-Type"), resp.Header.Get("Allow"), body, err, c.status, c.allow, c.msg)
		}
	}
}
