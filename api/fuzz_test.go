package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
)

// fuzzRoutes are the server API's routes (docs/api.md), each with a body it accepts.
var fuzzRoutes = []struct{ route, body string }{
	{"POST /v1/rooms", `{"room":"stage","name":"Main stage","owner":"host","settings":{"max_members":50000,"who_may_send":"SEND_POLICY_MEMBERS"}}`},
	{"PATCH /v1/rooms/{room}", `{"settings":{"max_members":100}}`},
	{"POST /v1/rooms/{room}/close", `{"reason":"the show is over"}`},
	{"GET /v1/rooms/{room}", ``},
	{"GET /v1/rooms/{room}/members", ``},
	{"POST /v1/rooms/{room}/messages", `{"type":"notice","lane":"critical","body":"doors open","tag_expr":"\"vip\" in tags"}`},
	{"POST /v1/rooms/{room}/messages/batch", `{"messages":[{"body":"first"},{"body_base64":"c2Vjb25k","lane":"bulk"}]}`},
	{"POST /v1/rooms/{room}/mute", `{"muted":true}`},
	{"POST /v1/rooms/{room}/members/{uid}/mute", `{"duration_ms":600000}`},
	{"POST /v1/rooms/{room}/members/{uid}/ban", `{"reason":"spam","duration_ms":1}`},
	{"POST /v1/users/messages", `{"uids":["alice","bob"],"type":"dm","body":"your prize is ready"}`},
	{"POST /v1/users/{uid}/kick", `{"room":"lobby","reason":"be nice"}`},
	{"GET /v1/users/{uid}/sessions", ``},
	{"GET /v1/online", ``},
	{"PUT /v1/users/{uid}/tags", `{"room":"lobby","tags":["vip","class-1"]}`},
	{"GET /v1/users/{uid}/tags", ``},
	{"PUT /v1/rooms/{room}/cdn", `{"mode":"CDN_MODE_BULK"}`},
	{"GET /v1/rooms/{room}/cdn", ``},
	{"PUT /v1/cdn", `{"vendors":[{"url_template":"https://cdn-a.example.com/rc/{app}/{room}/{window_ms}/{index}","weight":3,"regions":["AS/CN"]}],"online_threshold":5000}`},
	{"GET /v1/cdn", ``},
	{"POST /v1/rooms/messages", `{"type":"notice","lane":"critical","body":"maintenance at 2","spread_ms":2000}`},
	{"DELETE /v1/rooms/{room}/messages/{message_id}", `{"unkept":true}`},
}

// FuzzAPIRequest sends the server API (served by a real services role) requests with any
// body, path parameters and query: every answer must be the API's JSON, a success or an
// error body whose code agrees with its HTTP status, and never INTERNAL: outside input is
// refused as a bad request before it reaches a service or the store.
func FuzzAPIRequest(f *testing.F) {
	for i, r := range fuzzRoutes {
		f.Add(uint8(i), "lobby", "alice", []byte(r.body), "")
	}
	f.Add(uint8(4), "lobby", "u", []byte(nil), "page_size=2&page_token=bm9kZQBhZnRlcg")
	f.Add(uint8(4), "lobby", "u", []byte(nil), "page_size=99999999999")
	f.Add(uint8(5), "lobby", "u", []byte(`{"body":"x","tag_expr":"(((((("}`), "")
	f.Add(uint8(10), "lobby", "u", []byte(`{"uids":[],"body":"x"}`), "")
	f.Add(uint8(0), "a.b", "u", []byte(`{"room":"a.b"}`), "")
	c := testcluster.Start(f, testcluster.ChatLinks(1))
	mux := http.NewServeMux()
	c.API.Register(mux)
	f.Fuzz(func(t *testing.T, route uint8, room, uid string, body []byte, query string) {
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		method, path, _ := strings.Cut(r.route, " ")
		// An empty path segment, "." or ".." would not reach this route: the mux cleans
		// the path and redirects.
		if room == "" || room == "." || room == ".." {
			room = "r"
		}
		if uid == "" || uid == "." || uid == ".." {
			uid = "u"
		}
		path = strings.NewReplacer("{room}", url.PathEscape(room), "{uid}", url.PathEscape(uid)).Replace(path)
		req := httptest.NewRequest(method, "/", bytes.NewReader(body))
		req.URL.Path, req.URL.RawQuery = path, query
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)

		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: HTTP %d, Content-Type %q: %s", method, path, rec.Code, ct, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %s: HTTP %d, body is not JSON: %q", method, path, rec.Code, rec.Body)
		}
		if rec.Code < 300 {
			return
		}
		var e struct {
			Code  uint32
			Name  string
			Error string
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Name == "" || e.Error == "" {
			t.Fatalf("%s %s: HTTP %d with an error body %s (%v)", method, path, rec.Code, rec.Body, err)
		}
		switch {
		case e.Code == 500:
			t.Fatalf("%s %s body %q query %q: INTERNAL: %s", method, path, body, query, e.Error)
		case e.Code < 500 && rec.Code >= 500, e.Code >= 500 && rec.Code < 500:
			t.Fatalf("%s %s: HTTP %d for error code %d", method, path, rec.Code, e.Code)
		}
	})
}
