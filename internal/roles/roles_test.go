package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"

	"roomcast/api"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/auth"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startNATS(t *testing.T, cfg devnats.Config) *server.Server {
	t.Helper()
	s, err := devnats.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// The configs `roomcast services` and `roomcast chatlink` build from their flags.
func servicesConfig(natsURL string) ServicesConfig {
	return ServicesConfig{NATSURL: natsURL, API: api.Config{Keys: auth.APIKeys{"k1": {App: "demo"}}}}
}

func chatLinkConfig(natsURL, node string) ChatLinkConfig {
	return ChatLinkConfig{
		NATSURL:   natsURL,
		Node:      chatlink.Config{Node: node, Keys: auth.Keyring{"demo": []byte("s")}, WSListen: "127.0.0.1:0", TCPListen: "127.0.0.1:0"},
		OpsListen: "127.0.0.1:0",
	}
}

// getHealth fetches url's /healthz and returns its status code and JSON object.
func getHealth(url string) (int, map[string]any, error) {
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		return resp.StatusCode, nil, fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	var body map[string]any
	err = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body, err
}

// Both roles, started as the commands start them, answer /healthz in one JSON shape: status
// "ok" with 200 while they can work, "unavailable" with 503 and the reason when they cannot.
func TestHealthzOneShape(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ns := startNATS(t, devnats.Config{StoreDir: dir})
	port := ns.Addr().(*net.TCPAddr).Port
	svc, err := StartServices(servicesConfig(ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	cl, err := StartChatLink(chatLinkConfig(ns.ClientURL(), "edge-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Shutdown(context.Background()) }()
	endpoints := map[string]string{"services": svc.URL(), "chatlink": "http://" + cl.OpsAddr()}

	// wantKeys are the keys each role's body has besides the shared ones.
	wantKeys := map[string][]string{"services": {"chatlinks", "dispatcher"}, "chatlink": {"node", "connections"}}
	check := func(wantCode int, wantStatus string) {
		t.Helper()
		for role, url := range endpoints {
			testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
				code, body, err := getHealth(url)
				if err != nil {
					return err
				}
				if code != wantCode || body["status"] != wantStatus {
					return fmt.Errorf("%s answers %d %s", role, code, stringify(body))
				}
				return nil
			})
			_, body, _ := getHealth(url)
			keys := []string{"status"}
			if wantStatus != "ok" {
				keys = append(keys, "error")
			}
			keys = append(keys, wantKeys[role]...)
			slices.Sort(keys)
			if got := slices.Sorted(maps.Keys(body)); !slices.Equal(got, keys) {
				t.Errorf("%s /healthz has keys %v, want %v", role, got, keys)
			}
			var h Health // the documented shape holds every field
			dec := json.NewDecoder(strings.NewReader(stringify(body)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&h); err != nil || h.Status != wantStatus {
				t.Errorf("%s /healthz %s as Health: %v", role, stringify(body), err)
			}
		}
	}
	check(http.StatusOK, "ok")
	if _, body, _ := getHealth(svc.URL()); body["chatlinks"] != 1.0 {
		t.Errorf("services /healthz %s: want 1 chatlink", stringify(body))
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	check(http.StatusServiceUnavailable, "unavailable")
	// Back on the same port and data, the roles reconnect (and stop without waiting on a
	// missing server).
	startNATS(t, devnats.Config{Port: port, StoreDir: dir})
	check(http.StatusOK, "ok")
}

func stringify(v any) string { b, _ := json.Marshal(v); return string(b) }

// A role that fails to start returns the error and leaves nothing running: no goroutine, no
// NATS connection, no listener. Not parallel: it counts the process's goroutines.
func TestStartErrorsCleanUp(t *testing.T) {
	ns := startNATS(t, devnats.Config{StoreDir: t.TempDir()})
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	inUse := busy.Addr().String()
	free := testkit.FreeAddr(t)
	// A start that works first, so that the JetStream streams and buckets the roles create,
	// and the NATS server's goroutines that keep them, exist before the failing starts.
	svc, err := StartServices(servicesConfig(ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()
	cl, err := StartChatLink(chatLinkConfig(ns.ClientURL(), "edge-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		start func() (func(), error)
		want  string
	}{
		{"services HTTP address in use", func() (func(), error) {
			cfg := servicesConfig(ns.ClientURL())
			cfg.Listen = inUse
			s, err := StartServices(cfg)
			return closer(s), err
		}, "address already in use"},
		{"services gRPC address in use, after the HTTP listener opened", func() (func(), error) {
			cfg := servicesConfig(ns.ClientURL())
			cfg.Listen, cfg.GRPCListen = free, inUse
			s, err := StartServices(cfg)
			return closer(s), err
		}, "address already in use"},
		{"dispatcher config bad, after the room and presence services started", func() (func(), error) {
			cfg := servicesConfig(ns.ClientURL())
			cfg.Instances = 2
			cfg.Dispatcher = dispatcher.Config{TrustedProxies: []string{"not-an-address"}}
			s, err := StartServices(cfg)
			return closer(s), err
		}, "not-an-address"},
		{"chatlink ops address in use", func() (func(), error) {
			cfg := chatLinkConfig(ns.ClientURL(), "edge-b")
			cfg.OpsListen = inUse
			c, err := StartChatLink(cfg)
			return shutdowner(c), err
		}, "address already in use"},
		{"chatlink bad node name, after connecting", func() (func(), error) {
			c, err := StartChatLink(chatLinkConfig(ns.ClientURL(), "bad name"))
			return shutdowner(c), err
		}, "bad name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			stop, err := tc.start()
			if stop != nil {
				stop()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start returned %v, want an error about %q", err, tc.want)
			}
			if stop != nil {
				t.Fatal("start returned a role with its error")
			}
			goleak.VerifyNone(t, before)
			if n := ns.NumClients(); n != 0 {
				t.Errorf("%d NATS connections left open", n)
			}
			ln, err := net.Listen("tcp", free)
			if err != nil {
				t.Fatalf("a listener left open: %v", err)
			}
			ln.Close()
		})
	}
}

func closer(s *Services) func() {
	if s == nil {
		return nil
	}
	return s.Close
}

func shutdowner(c *ChatLink) func() {
	if c == nil {
		return nil
	}
	return func() { _ = c.Shutdown(context.Background()) }
}
