package api_test

import (
	"strings"
	"testing"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
)

func TestAPIBadInput(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	msgs := "/v1/rooms/lobby/messages"
	key := devcluster.APIKey
	cases := []struct {
		name, path, key, body string
		status                int
		code                  float64
	}{
		{"no key", msgs, "", `{"body":"x"}`, 401, 106},
		{"wrong key", msgs, "nope", `{"body":"x"}`, 401, 106},
		{"bad room name", "/v1/rooms/a.b/messages", key, `{"body":"x"}`, 400, 100},
		{"not JSON", msgs, key, `hello`, 400, 100},
		{"unknown field", msgs, key, `{"body":"x","colour":"red"}`, 400, 100},
		{"two objects", msgs, key, `{"body":"x"}{"body":"y"}`, 400, 100},
		{"empty body", msgs, key, `{"type":"chat"}`, 400, 100},
		{"bad lane", msgs, key, `{"body":"x","lane":"fast"}`, 400, 100},
		{"bad sender", msgs, key, `{"body":"x","sender":"a b"}`, 400, 100},
		{"both bodies", msgs, key, `{"body":"x","body_base64":"eA=="}`, 400, 100},
		{"message too large", msgs, key, `{"body":"` + strings.Repeat("x", 16<<10+1) + `"}`, 413, 101},
		{"request too large", msgs, key, `{"body":"` + strings.Repeat("x", 65<<10) + `"}`, 413, 101},
		{"bad tag expression", msgs, key, `{"body":"x","tag_expr":"len(tags) > 1"}`, 400, 104},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out := httpCall(t, c, "POST", tc.path, tc.key, tc.body)
			if status != tc.status || out["code"] != tc.code || out["error"] == "" {
				t.Fatalf("HTTP %d %v, want %d with code %v", status, out, tc.status, tc.code)
			}
		})
	}

	status, out := httpCall(t, c, "POST", msgs, key, `{"body":"hello","lane":"bulk","sender":"host"}`)
	if status != 200 || len(out["id"].(string)) != 26 || out["server_time_ms"].(float64) == 0 {
		t.Fatalf("good send: HTTP %d %v", status, out)
	}
	// A room never created and with nobody in it does not exist.
	status, out = httpCall(t, c, "GET", "/v1/rooms/lobby", key, "")
	if status != 404 || out["code"].(float64) != 105 {
		t.Fatalf("room info: HTTP %d %v", status, out)
	}

	// With the room service gone, the API says so instead of hanging.
	for _, r := range c.Rooms {
		r.Close()
	}
	status, out = httpCall(t, c, "POST", msgs, key, `{"body":"anyone?"}`)
	if status != 503 || out["code"].(float64) != 503 {
		t.Fatalf("room service down: HTTP %d %v, want 503", status, out)
	}
}
