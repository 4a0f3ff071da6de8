package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"roomcast/internal/auth"
)

// TestRegister checks that Register mounts every route of docs/api.md beside the caller's own
// handlers: without an API key each answers the API's 401, before it asks any service.
func TestRegister(t *testing.T) {
	t.Parallel()
	a := bareAPI(auth.APIKeys{"k": {App: "app"}})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/dispatch", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	a.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	call := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Content-Type")
	}
	for _, r := range []string{
		"POST /v1/rooms", "PATCH /v1/rooms/r", "POST /v1/rooms/r/close", "GET /v1/rooms/r",
		"GET /v1/rooms/r/members", "POST /v1/rooms/r/messages", "POST /v1/rooms/r/messages/batch",
		"POST /v1/rooms/r/mute", "POST /v1/rooms/r/members/u/mute", "POST /v1/rooms/r/members/u/ban",
		"POST /v1/users/messages", "POST /v1/users/u/kick", "GET /v1/users/u/sessions",
		"POST /v1/users/u/sessions/cl-1-1/messages", "POST /v1/rooms/messages",
		"GET /v1/online", "PUT /v1/users/u/tags", "GET /v1/users/u/tags",
		"PUT /v1/rooms/r/cdn", "GET /v1/rooms/r/cdn", "PUT /v1/cdn", "GET /v1/cdn", "PUT /v1/limits", "GET /v1/limits",
		"POST /v1/rooms/r/kick", "GET /v1/rooms/r/online",
		"GET /v1/rooms/r/queue", "POST /v1/rooms/r/queue", "DELETE /v1/rooms/r/queue",
		"GET /v1/rooms/r/queue/head", "POST /v1/rooms/r/queue/poll", "DELETE /v1/rooms/r/queue/k",
		"DELETE /v1/rooms/r/messages/01KB0000000000000000000000",
	} {
		method, path, _ := strings.Cut(r, " ")
		if status, ctype := call(method, path); status != http.StatusUnauthorized || ctype != "application/json" {
			t.Errorf("%s: HTTP %d %s, want the API's 401", r, status, ctype)
		}
	}
	if status, _ := call("GET", "/v1/dispatch"); status != http.StatusTeapot {
		t.Errorf("the caller's own route: HTTP %d", status)
	}
	if status, _ := call("DELETE", "/v1/rooms/r"); status != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /v1/rooms/r: HTTP %d, want 405", status)
	}
	if status, _ := call("GET", "/v1/rooms/r/nothing"); status != http.StatusNotFound {
		t.Errorf("GET /v1/rooms/r/nothing: HTTP %d, want 404", status)
	}
}

// bareAPI is an API made without New, for tests of calls refused before any service is asked:
// no bus to open the stores on, which such calls never reach.
func bareAPI(keys auth.APIKeys) *API {
	return &API{cfg: Config{Keys: keys}, audit: slog.New(slog.DiscardHandler), m: newMetrics(nil)}
}
