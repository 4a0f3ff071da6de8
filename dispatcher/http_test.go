package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/dispatcherpb"
)

func TestHTTP(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	d, _ := newTest(t, Config{CityDB: city, ISPDB: isp, TrustedProxies: []string{"192.0.2.0/24"}})
	get := func(remote string, header http.Header) (*httptest.ResponseRecorder, Answer) {
		req := httptest.NewRequest("GET", "/v1/dispatch?app=demo&room=r&uid=u", nil)
		req.RemoteAddr = remote
		for k, v := range header {
			req.Header[k] = v
		}
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		var ans Answer
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
		}
		return rec, ans
	}
	rec, _ := get("203.0.113.1:1", nil)
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != `{"error":"dispatcher: no ChatLink available"}`+"\n" {
		t.Fatalf("no nodes: HTTP %d %s, want 503 with an error", rec.Code, rec.Body)
	}

	report(d, nodeReport("jl", "AS/CN/22", "unicom", 500, 1000))
	report(d, nodeReport("gb", "EU/GB/ENG", "", 0, 1000))
	// The keys the SDK and the demo page read, and nothing renamed.
	rec, _ = get("203.0.113.1:1", nil)
	var raw map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || raw["ttl_ms"] != float64(30000) {
		t.Fatalf("body %s", rec.Body)
	}
	first := raw["nodes"].([]any)[0].(map[string]any)
	if first["node"] == nil || first["ws_url"] == nil || first["tcp_addr"] == nil {
		t.Fatalf("endpoint %v: want node, ws_url, tcp_addr", first)
	}

	jilin := http.Header{"X-Forwarded-For": {"175.16.199.9"}}
	if _, ans := get("192.0.2.10:443", jilin); ans.Nodes[0].Node != "jl" {
		t.Fatalf("Jilin client behind a trusted proxy: %q, want jl", names(ans))
	}
	// The same header from anyone else is ignored: the peer (unlocated) gets the emptier node.
	if _, ans := get("203.0.113.1:1", jilin); ans.Nodes[0].Node != "gb" {
		t.Fatalf("spoofed header: %q, want gb", names(ans))
	}
	if got := counterValue(d.m.clientAddr[sourceIgnored]); got != 1 {
		t.Fatalf("client_address{source=ignored_headers} = %v, want 1", got)
	}
	if _, ans := get("192.0.2.10:443", http.Header{"X-Forwarded-For": {"garbage"}}); ans.Nodes[0].Node != "gb" {
		t.Fatalf("garbage header from the proxy: %q, want load alone (gb)", names(ans))
	}
	for _, q := range []string{"app=demo", "room=r", "app=demo&room=a.b", "app=%20&room=r"} {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/dispatch?"+q, nil))
		var body map[string]string
		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body["error"] == "" {
			t.Fatalf("?%s: HTTP %d %s, want 400 with an error", q, rec.Code, rec.Body)
		}
	}
}

func TestNodesHandler(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	d, _ := newTest(t, Config{CityDB: city, ISPDB: isp})
	r := nodeReport("jl", "AS/CN/22", "unicom", 10, 1000)
	r.BusRttUs, r.Cpu = 300, 0.25
	report(d, r)
	report(d, nodeReport("gb", "EU/GB/ENG", "BT", 0, 0))
	if _, err := d.Dispatch(Request{}); err != nil {
		t.Fatal(err)
	}

	get := func(target string) (int, map[string]any) {
		rec := httptest.NewRecorder()
		d.NodesHandler().ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body
	}
	code, body := get("/v1/nodes")
	nodes, _ := body["nodes"].([]any)
	if code != 200 || len(nodes) != 2 {
		t.Fatalf("HTTP %d %v", code, body)
	}
	gb := nodes[0].(map[string]any)
	if gb["node"] != "gb" || gb["region"] != "EU/GB/ENG" || gb["capacity_note"] == nil ||
		gb["report"].(map[string]any)["connections"] != float64(0) {
		t.Fatalf("gb: %v", gb)
	}
	jl := nodes[1].(map[string]any)
	if jl["isps"].([]any)[0] != "unicom" || jl["link_quality"].(float64) < 0.9 || jl["report"].(map[string]any)["bus_rtt_us"] != float64(300) {
		t.Fatalf("jl: %v", jl)
	}
	if body["health"].(map[string]any)["mode"] != ModeRegionISP {
		t.Fatalf("health in the admin view: %v", body["health"])
	}

	code, body = get("/v1/nodes?ip=175.16.199.9")
	nodes = body["nodes"].([]any)
	client := body["client"].(map[string]any)
	if code != 200 || client["region"] != "AS/CN/22" || client["isp"] != "unicom" ||
		nodes[0].(map[string]any)["node"] != "jl" || nodes[0].(map[string]any)["match"] != "subdivision" {
		t.Fatalf("with a client: %v", body)
	}
	if code, _ := get("/v1/nodes?ip=nonsense"); code != http.StatusBadRequest {
		t.Fatalf("bad ip: HTTP %d, want 400", code)
	}
	if _, err := d.Dispatch(Request{App: "demo", Room: "r"}); err != nil {
		t.Fatal(err)
	}
	code, body = get("/v1/nodes?app=demo&room=r")
	room, _ := body["room"].(map[string]any)
	members, _ := room["members"].(map[string]any)
	if code != 200 || len(members) != 1 || members["gb"] != float64(1) {
		t.Fatalf("room view: HTTP %d %v, want gb: 1", code, body["room"])
	}
	if code, _ := get("/v1/nodes?room=r"); code != http.StatusBadRequest {
		t.Fatalf("room without app: HTTP %d, want 400", code)
	}
}

func TestGRPC(t *testing.T) {
	t.Parallel()
	city, isp := writeFixture(t, t.TempDir())
	d, _ := newTest(t, Config{CityDB: city, ISPDB: isp, TrustedProxies: []string{"127.0.0.1"}})
	srv := grpc.NewServer()
	d.RegisterGRPC(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := dispatcherpb.NewDispatcherClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err = client.Dispatch(ctx, &dispatcherpb.DispatchRequest{App: "demo", Room: "r", Uid: "u"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("no nodes: %v, want UNAVAILABLE", err)
	}
	report(d, nodeReport("jl", "AS/CN/22", "unicom", 500, 1000))
	report(d, nodeReport("gb", "EU/GB/ENG", "", 0, 1000))
	resp, err := client.Dispatch(ctx, &dispatcherpb.DispatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Nodes) != 2 || resp.Nodes[0].Node != "gb" || resp.Nodes[0].WsUrl != "ws://gb.test/v1/ws" ||
		resp.Nodes[0].TcpAddr != "gb.test:9000" || resp.TtlMs != 30000 {
		t.Fatalf("loopback client (load alone): %v", resp)
	}
	// 127.0.0.1 is a trusted proxy here, so its metadata names the client.
	md := metadata.Pairs("x-forwarded-for", "175.16.199.9")
	resp, err = client.Dispatch(metadata.NewOutgoingContext(ctx, md), &dispatcherpb.DispatchRequest{})
	if err != nil || resp.Nodes[0].Node != "jl" {
		t.Fatalf("forwarded Jilin client: %v %v, want jl first", resp, err)
	}
	if _, err := client.Dispatch(ctx, &dispatcherpb.DispatchRequest{App: "demo", Room: "a.b"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad room: %v, want INVALID_ARGUMENT", err)
	}
	// The room reaches the decision: the member goes to the node holding it.
	held := nodeReport("jl", "AS/CN/22", "unicom", 500, 1000)
	held.RoomsHeld = []*buspb.RoomCount{{App: "demo", Room: "r", Members: 100}}
	report(d, held)
	resp, err = client.Dispatch(ctx, &dispatcherpb.DispatchRequest{App: "demo", Room: "r"})
	if err != nil || resp.Nodes[0].Node != "jl" {
		t.Fatalf("a member of the room held by jl: %v %v, want jl first", resp, err)
	}
	md = metadata.Pairs("x-real-ip", "175.16.199.9")
	resp, err = client.Dispatch(metadata.NewOutgoingContext(ctx, md), &dispatcherpb.DispatchRequest{})
	if err != nil || resp.Nodes[0].Node != "jl" {
		t.Fatalf("x-real-ip Jilin client: %v %v, want jl first", resp, err)
	}
}

// Load reports arrive over a real NATS server, from the subject ChatLinks publish on.
func TestReportsOverNATS(t *testing.T) {
	t.Parallel()
	s := testkit.NATS(t)
	nc, err := bus.Connect(s.ClientURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	d, err := New(Config{Bus: nc})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	for i := range 3 {
		if err := bus.Publish(nc, bus.SubjectLoad, nodeReport(fmt.Sprintf("n%d", i), "", "", 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Publish(bus.SubjectLoad, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := d.LiveNodes(); n != 3 {
			return fmt.Errorf("%d live nodes, want 3", n)
		}
		return nil
	})
	if ans, err := d.Dispatch(Request{}); err != nil || len(ans.Nodes) != 3 {
		t.Fatalf("%+v %v", ans, err)
	}
	d.Close() // twice, with the cleanup
}
