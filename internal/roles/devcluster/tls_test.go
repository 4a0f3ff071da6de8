package devcluster_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"roomcast/chatlink"
	"roomcast/internal/auth"
	"roomcast/internal/certfiles"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcerts"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/dispatcherpb"
	"roomcast/sdk"
)

func startCluster(t *testing.T, cfg devcluster.Config) *devcluster.Cluster {
	t.Helper()
	cfg.DataDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// servedSerial makes a new TLS connection to addr and returns the serial number of the
// certificate it presents.
func servedSerial(ca *testcerts.CA, addr string) (string, error) {
	d := tls.Dialer{Config: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}, NetDialer: &net.Dialer{Timeout: 5 * time.Second}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	return nc.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// A cluster with certificate files serves every listener over TLS: Go SDK clients log in and
// chat over wss:// and TLS TCP, the server API answers over HTTPS and gRPC with TLS, and when
// the files are replaced new connections get the new certificate, with no restart.
func TestTLS(t *testing.T) {
	ca := testcerts.NewCA(t)
	dir := t.TempDir()
	first := ca.Issue(t)
	certFile, keyFile := first.Write(t, dir)
	c := startCluster(t, devcluster.Config{ChatLinks: 1, TLS: certfiles.Config{CertFile: certFile, KeyFile: keyFile, CheckEvery: 20 * time.Millisecond}})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	if !strings.HasPrefix(c.URL(), "https://") {
		t.Fatalf("URL %s, want https://", c.URL())
	}

	// The dispatcher tells clients the scheme, over HTTPS and over gRPC with TLS.
	var ans struct{ Nodes []sdk.Endpoint }
	resp, err := hc.Get(c.URL() + "/v1/dispatch?app=demo&room=r&uid=u")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if err != nil || len(ans.Nodes) != 1 || !strings.HasPrefix(ans.Nodes[0].WSURL, "wss://") || !ans.Nodes[0].TCPTLS {
		t.Fatalf("dispatch over HTTPS: %+v %v, want a wss:// URL and tcp_tls", ans, err)
	}
	conn, err := grpc.NewClient(c.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := dispatcherpb.NewDispatcherClient(conn).Dispatch(ctx, &dispatcherpb.DispatchRequest{App: "demo", Room: "r", Uid: "u"})
	if err != nil || len(d.Nodes) != 1 || !strings.HasPrefix(d.Nodes[0].WsUrl, "wss://") || !d.Nodes[0].TcpTls {
		t.Fatalf("dispatch over gRPC with TLS: %v %v", d, err)
	}

	for _, transport := range []string{sdk.TransportWebSocket, sdk.TransportTCP} {
		t.Run(transport, func(t *testing.T) {
			room := "tls-" + transport
			got := make(chan string, 10)
			dial := func(uid string, onMsg func(*clientpb.Message)) *sdk.Client {
				tok, err := c.Mint(uid, room, nil, time.Hour, auth.WithLanes(auth.LaneCritical))
				if err != nil {
					t.Fatal(err)
				}
				cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL(), Transport: transport, TLS: ca.ClientConfig(), OnMessage: onMsg})
				if err != nil {
					t.Fatalf("%s over %s: %v", uid, transport, err)
				}
				t.Cleanup(func() { _ = cl.Close() })
				return cl
			}
			alice := dial("alice", nil)
			dial("bob", func(m *clientpb.Message) { got <- string(m.Body) })
			if _, err := alice.Send(ctx, sdk.Outgoing{Body: []byte("hi over " + transport), Lane: clientpb.Lane_LANE_CRITICAL}); err != nil {
				t.Fatal(err)
			}
			// The server API over HTTPS reaches the same room.
			req, _ := http.NewRequest(http.MethodPost, c.URL()+"/v1/rooms/"+room+"/messages", strings.NewReader(`{"lane":"critical","body":"from the API"}`))
			req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("server API over HTTPS: %s", resp.Status)
			}
			for _, want := range []string{"hi over " + transport, "from the API"} {
				select {
				case b := <-got:
					if b != want {
						t.Fatalf("bob got %q, want %q", b, want)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("bob did not get %q", want)
				}
			}
		})
	}

	// A client that does not trust the CA is refused at the handshake.
	tok, _ := c.Mint("eve", "r", nil, time.Hour)
	if _, err := sdk.Dial(ctx, sdk.Config{Token: tok, Endpoints: ans.Nodes, Transport: sdk.TransportTCP}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without the CA: %v, want a certificate error", err)
	}

	// The server API answers over gRPC with TLS.
	md := metadata.Pairs("authorization", "Bearer "+devcluster.APIKey)
	if sent, err := apipb.NewRoomcastAPIClient(conn).SendToRoom(metadata.NewOutgoingContext(ctx, md), &apipb.SendToRoomRequest{Room: "tls-ws", Body: "over gRPC"}); err != nil || sent.Id == "" {
		t.Fatalf("SendToRoom over gRPC with TLS: %v %v", sent, err)
	}

	// New certificate files: every listener's new connections get the new certificate.
	u, _ := url.Parse(ans.Nodes[0].WSURL)
	addrs := map[string]string{"wss": u.Host, "tls tcp": ans.Nodes[0].TCPAddr, "https": strings.TrimPrefix(c.URL(), "https://"), "grpc": c.GRPCAddr()}
	for what, addr := range addrs {
		if got, err := servedSerial(ca, addr); err != nil || got != first.Cert.SerialNumber.String() {
			t.Fatalf("%s serves serial %s (%v), want the first %s", what, got, err, first.Cert.SerialNumber)
		}
	}
	second := ca.Issue(t)
	second.Write(t, dir)
	want := second.Cert.SerialNumber.String()
	for what, addr := range addrs {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if got, err := servedSerial(ca, addr); err != nil || got != want {
				return fmt.Errorf("%s serves serial %s (%v), want the new %s", what, got, err, want)
			}
			return nil
		})
	}
	cl, err := sdk.Dial(ctx, sdk.Config{Token: tok, Dispatcher: c.URL(), TLS: ca.ClientConfig()})
	if err != nil {
		t.Fatalf("login after the certificate changed: %v", err)
	}
	_ = cl.Close()
}

// A node behind a TLS-terminating proxy advertises the proxy's URLs, not its listeners'.
func TestPublicURLs(t *testing.T) {
	c := startCluster(t, devcluster.Config{ChatLinks: 1, ChatLink: chatlink.Config{
		PublicWSURL: "wss://edge.example.com/v1/ws", PublicTCPAddr: "edge.example.com:5443", PublicTCPTLS: true,
	}})
	var ans struct{ Nodes []sdk.Endpoint }
	resp, err := http.Get(c.URL() + "/v1/dispatch?app=demo&room=r&uid=u")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		t.Fatal(err)
	}
	want := sdk.Endpoint{Node: "cl-1", WSURL: "wss://edge.example.com/v1/ws", TCPAddr: "edge.example.com:5443", TCPTLS: true}
	if len(ans.Nodes) != 1 || ans.Nodes[0] != want {
		t.Fatalf("dispatch answers %+v, want %+v", ans.Nodes, want)
	}
}

// CORS on the browser-facing routes: allowed origins get the headers on preflights and on
// requests, others and the other routes get none.
func TestCORS(t *testing.T) {
	c := startCluster(t, devcluster.Config{ChatLinks: 1, CORSOrigins: []string{"https://app.example.com", "self"}})
	self := "http://localhost:" + c.URL()[strings.LastIndex(c.URL(), ":")+1:]
	for _, tc := range []struct {
		name, method, path, origin string
		wantStatus                 int
		wantAllow                  string
	}{
		{"preflight dispatch, allowed", http.MethodOptions, "/v1/dispatch?app=demo&room=r&uid=u", "https://app.example.com", http.StatusNoContent, "https://app.example.com"},
		{"preflight dispatch, other origin", http.MethodOptions, "/v1/dispatch", "https://evil.example.com", http.StatusNoContent, ""},
		{"dispatch, allowed", http.MethodGet, "/v1/dispatch?app=demo&room=r&uid=u", "https://app.example.com", http.StatusOK, "https://app.example.com"},
		{"dispatch, the page's own origin (self)", http.MethodGet, "/v1/dispatch?app=demo&room=r&uid=u", self, http.StatusOK, self},
		{"dispatch, other origin", http.MethodGet, "/v1/dispatch?app=demo&room=r&uid=u", "https://evil.example.com", http.StatusOK, ""},
		{"preflight dev token, allowed", http.MethodOptions, "/v1/dev/token", "https://app.example.com", http.StatusNoContent, "https://app.example.com"},
		{"dev token, allowed", http.MethodGet, "/v1/dev/token?uid=u&room=r", "https://app.example.com", http.StatusOK, "https://app.example.com"},
		{"dev token, other origin", http.MethodGet, "/v1/dev/token?uid=u&room=r", "https://evil.example.com", http.StatusOK, ""},
		{"server API: no CORS", http.MethodGet, "/v1/rooms/r", "https://app.example.com", http.StatusUnauthorized, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, c.URL()+tc.path, nil)
			req.Header.Set("Origin", tc.origin)
			if tc.method == http.MethodOptions {
				req.Header.Set("Access-Control-Request-Method", "GET")
				req.Header.Set("Access-Control-Request-Headers", "content-type")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			h := resp.Header
			if resp.StatusCode != tc.wantStatus || h.Get("Access-Control-Allow-Origin") != tc.wantAllow {
				t.Fatalf("%d, Access-Control-Allow-Origin %q; want %d, %q", resp.StatusCode, h.Get("Access-Control-Allow-Origin"), tc.wantStatus, tc.wantAllow)
			}
			preflightOK := tc.method == http.MethodOptions && tc.wantAllow != ""
			if got := h.Get("Access-Control-Allow-Methods") != ""; got != preflightOK {
				t.Errorf("Access-Control-Allow-Methods %q", h.Get("Access-Control-Allow-Methods"))
			}
			if preflightOK && (h.Get("Access-Control-Allow-Headers") != "content-type" || h.Get("Access-Control-Max-Age") == "") {
				t.Errorf("preflight headers %v", h)
			}
			if tc.wantAllow != "" && !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
				t.Errorf("Vary %q: want Origin", h.Values("Vary"))
			}
		})
	}
}
