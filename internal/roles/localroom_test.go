package roles

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"roomcast/internal/bus"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// TestAPISendsSkipTheBus: the server API hands its sends to the room service in its process,
// so no send request crosses NATS, and the answers are those NATS would carry (ids, a
// refusal's code); once that instance closes, the sends go over NATS to the other one.
func TestAPISendsSkipTheBus(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, devnats.Config{StoreDir: t.TempDir()})
	cfg := servicesConfig(ns.ClientURL())
	cfg.Instances = 2
	s, err := StartServices(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc := testkit.Connect(t, ns)
	seen, err := nc.SubscribeSync("rc.svc.room.>") // beside the services' queue group: sees every request
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// requests returns how many room sends crossed NATS since the last call. A request the API
	// made went through the NATS server before its answer, and so before this flush's pong.
	requests := func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := seen.NextMsg(0)
			if err != nil {
				return n
			}
			if m.Subject == bus.SubjectRoomSend || m.Subject == bus.SubjectRoomSendBatch {
				n++
			}
		}
	}
	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", s.URL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return resp.StatusCode, out
	}

	if code, out := post("/v1/rooms/r1/messages", `{"body":"hi"}`); code != 200 || out["id"] == nil {
		t.Fatalf("send: %d %v", code, out)
	}
	if code, out := post("/v1/rooms/r1/messages/batch", `{"messages":[{"body":"a"},{"body":"b"}]}`); code != 200 || len(out["ids"].([]any)) != 2 {
		t.Fatalf("batch: %d %v", code, out)
	}
	if code, out := post("/v1/rooms/r1/messages", `{"body":"hi","tag_expr":"tags +"}`); code != 400 || out["name"] != "BAD_TAG_EXPR" {
		t.Fatalf("a bad tag expression: %d %v, want 400 BAD_TAG_EXPR as from the bus", code, out)
	}
	if n := requests(); n != 0 {
		t.Fatalf("%d send requests crossed NATS, want 0", n)
	}

	s.Rooms[0].Close()
	if code, out := post("/v1/rooms/r1/messages", `{"body":"hi"}`); code != 200 || out["id"] == nil {
		t.Fatalf("send with the local instance closed: %d %v", code, out)
	}
	if n := requests(); n != 1 {
		t.Fatalf("%d send requests crossed NATS with the local instance closed, want 1", n)
	}
}
