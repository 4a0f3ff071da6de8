package roles

import (
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

func TestCORSPolicy(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	get := func(h http.Handler, path, origin string) http.Header {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Origin", origin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Header()
	}
	anyOrigin := newCORSPolicy([]string{"*"}, nil, []string{"/v1/dispatch"}).wrap(ok)
	if got := get(anyOrigin, "/v1/dispatch", "https://x.example").Get("Access-Control-Allow-Origin"); got != "*" {
		t.Errorf("with *: Access-Control-Allow-Origin %q, want *", got)
	}
	if got := get(anyOrigin, "/v1/nodes", "https://x.example").Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("a path outside the policy got Access-Control-Allow-Origin %q", got)
	}
	if h := get(newCORSPolicy(nil, nil, []string{"/v1/dispatch"}).wrap(ok), "/v1/dispatch", "https://x.example"); len(h) != 0 {
		t.Errorf("no origins configured, yet headers %v", h)
	}

	self := selfOrigins("https", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8443})
	want := []string{"https://127.0.0.1:8443", "https://localhost:8443", "https://[::1]:8443"}
	if !slices.Equal(self, want) {
		t.Errorf("selfOrigins of a loopback address: %v, want %v", self, want)
	}
	self = selfOrigins("http", &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 80})
	if !slices.Equal(self, []string{"http://10.1.2.3:80"}) {
		t.Errorf("selfOrigins of another address: %v", self)
	}
}
