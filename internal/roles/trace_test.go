package roles

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// A server API call's W3C traceparent reaches the room service over NATS: the API's audit
// record and the room service's debug record of the send name the caller's trace id, and the
// room service sees the API's own span as the parent, not the caller's.
func TestTraceparentReachesRoomService(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, devnats.Config{StoreDir: t.TempDir()})
	logs := &testkit.Buffer{}
	cfg := servicesConfig(ns.ClientURL())
	cfg.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	const trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("POST", svc.URL()+"/v1/rooms/t1/messages", strings.NewReader(`{"body":"aGk="}`))
	req.Header.Set("Authorization", "Bearer k1")
	req.Header.Set("traceparent", "00-"+trace+"-"+parent+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("send: HTTP %d", resp.StatusCode)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		var room, audit bool
		for line := range strings.Lines(logs.String()) {
			switch {
			case strings.Contains(line, `"svc":"room"`) && strings.Contains(line, `"msg":"request answered"`) && strings.Contains(line, `"op":"send"`):
				room = strings.Contains(line, `"trace_id":"`+trace+`"`) && !strings.Contains(line, parent)
			case strings.Contains(line, `"msg":"api call"`) && strings.Contains(line, `"method":"POST /v1/rooms/{room}/messages"`):
				audit = strings.Contains(line, `"trace_id":"`+trace+`"`)
			}
		}
		if !room || !audit {
			return fmt.Errorf("room service's record with the trace: %v, API's audit record with it: %v; logs:\n%s", room, audit, logs.String())
		}
		return nil
	})
}
