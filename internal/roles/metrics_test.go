package roles

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
	"roomcast/internal/tools/probe"
	"roomcast/proto/clientpb"
)

// scrape GETs a role's /metrics and parses it.
func scrape(t *testing.T, opsAddr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + opsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value sums the samples of family name whose labels include want: counters' and gauges'
// values, histograms' observation counts. It returns -1 when the family is missing.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	var sum float64
next:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// Every role's ops endpoint serves its components' metric families, and they move when the
// thing they count happens: logins, sends and history reads at the room service, sessions and
// events at presence, calls at the server API, logins at the ChatLink. The audit trail records
// the refused login and the API calls that change something, and no read.
func TestRoleMetricsAndAudit(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, devnats.Config{StoreDir: t.TempDir()})
	audit := &testkit.Buffer{}
	cfg := servicesConfig(ns.ClientURL())
	cfg.OpsListen = "127.0.0.1:0"
	cfg.Audit = slog.New(slog.NewJSONHandler(audit, nil))
	svc, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	clCfg := chatLinkConfig(ns.ClientURL(), "edge-m")
	clCfg.Node.Audit = cfg.Audit
	cl, err := StartChatLink(clCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Shutdown(context.Background()) }()
	pusher := startStoragelessPusher(t, ns.ClientURL())

	// Every family is there before anything happened (counters by label appear when counted).
	families := map[string][]string{
		svc.OpsAddr(): {"roomcast_room_messages_accepted_total", "roomcast_room_send_batch_messages", "roomcast_room_bulk_sampled_out_total", "roomcast_presence_sessions",
			"roomcast_presence_replaced_sessions_total", "roomcast_dispatcher_nodes", "go_goroutines"},
		cl.OpsAddr():     {"roomcast_chatlink_login_seconds", "roomcast_chatlink_connections", "process_open_fds"},
		pusher.OpsAddr(): {"roomcast_cdnpusher_queued_segments", "go_goroutines"},
	}
	for addr, names := range families {
		fams := scrape(t, addr)
		for _, name := range names {
			if value(fams, name) < 0 {
				t.Errorf("%s/metrics has no %s", addr, name)
			}
		}
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error { return svc.health(&Health{}) })

	// A server API write and read, a probe's logins and sends, and a refused login.
	call := func(method, path, body string) int {
		req, _ := http.NewRequest(method, svc.URL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call("POST", "/v1/rooms", `{"room":"m1"}`); code != 201 {
		t.Fatalf("create room: %d", code)
	}
	if code := call("GET", "/v1/rooms/m1", ""); code != 200 {
		t.Fatalf("get room: %d", code)
	}
	if code := call("GET", "/v1/rooms/m1/history", ""); code != 200 {
		t.Fatalf("get history: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := probe.Run(ctx, probe.Config{Dispatcher: svc.URL(), Secret: []byte("s"), Room: "m1", Clients: 2, Messages: 3})
	if err != nil || !res.OK() {
		t.Fatalf("probe: %v %v", res, err)
	}
	// A member that stays: the probe's clients leave when it returns, and the sessions gauge
	// counts who is online now.
	tok, err := auth.Mint([]byte("s"), "demo", "stay", "m1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	member := testkit.DialWS(t, cl.Node.WSURL())
	defer member.Close()
	if f := member.LoginAs(tok, "web"); f.GetLoginAck() == nil {
		t.Fatalf("member login answered with %v", f)
	}
	bad := testkit.DialWS(t, cl.Node.WSURL())
	defer bad.Close()
	if k := bad.LoginAs("not a token", "web").GetKick(); k.GetCode() != uint32(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
		t.Fatalf("bad token answered with %v", k)
	}

	// The families moved.
	checks := []struct {
		addr, name string
		labels     []string
	}{
		{svc.OpsAddr(), "roomcast_api_requests_total", []string{"transport", "http", "method", "POST /v1/rooms", "code", "OK"}},
		{svc.OpsAddr(), "roomcast_api_requests_total", []string{"method", "GET /v1/rooms/{room}", "code", "OK"}},
		{svc.OpsAddr(), "roomcast_api_request_seconds", []string{"method", "POST /v1/rooms"}},
		{svc.OpsAddr(), "roomcast_room_requests_total", []string{"op", "join", "code", "OK"}},
		{svc.OpsAddr(), "roomcast_room_requests_total", []string{"op", "send", "code", "OK"}},
		{svc.OpsAddr(), "roomcast_room_requests_total", []string{"op", "history", "code", "OK"}},
		{svc.OpsAddr(), "roomcast_room_request_seconds", []string{"op", "send"}},
		{svc.OpsAddr(), "roomcast_room_messages_accepted_total", nil},
		{svc.OpsAddr(), "roomcast_room_batch_window_messages", nil},
		{svc.OpsAddr(), "roomcast_room_send_batch_messages", nil},
		{svc.OpsAddr(), "roomcast_presence_events_total", []string{"kind", "login"}},
		{svc.OpsAddr(), "roomcast_presence_sessions", nil},
		{svc.OpsAddr(), "roomcast_api_bus_request_seconds", []string{"subject", "rc.svc.room.history"}},
		{cl.OpsAddr(), "roomcast_chatlink_login_seconds", nil},
		{cl.OpsAddr(), "roomcast_chatlink_bus_request_seconds", []string{"op", "join"}},
		{cl.OpsAddr(), "roomcast_chatlink_bus_request_seconds", []string{"op", "send"}},
		{cl.OpsAddr(), "roomcast_chatlink_logins_total", []string{"result", "bad_token"}},
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		fams := map[string]map[string]*dto.MetricFamily{svc.OpsAddr(): scrape(t, svc.OpsAddr()), cl.OpsAddr(): scrape(t, cl.OpsAddr())}
		for _, c := range checks {
			if v := value(fams[c.addr], c.name, c.labels...); v <= 0 {
				return fmt.Errorf("%s%v is %v, want > 0", c.name, c.labels, v)
			}
		}
		return nil
	})

	// The audit trail: the refused login and the room's creation, not the reads. The key is
	// named by the start of its SHA-256, never itself.
	sum := sha256.Sum256([]byte("k1"))
	fingerprint := hex.EncodeToString(sum[:4])
	log := audit.String()
	for _, want := range []string{
		`"msg":"login refused","node":"edge-m","audit":true,"result":"bad_token"`,
		`"msg":"api call","svc":"api","audit":true,"transport":"http","method":"POST /v1/rooms","app":"demo","key":"` + fingerprint + `","room":"m1","result":"OK"`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log has no %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, `"method":"GET`) {
		t.Errorf("audit log has a read:\n%s", log)
	}
}
