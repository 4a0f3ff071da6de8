package roles

import (
	"net"
	"net/http"
	"slices"
	"strings"
)

// corsPolicy lets web pages of other origins call a few browser-facing routes (the dispatcher's
// GET /v1/dispatch, the dev assembly's token route): it answers their preflight OPTIONS
// requests itself and adds Access-Control-Allow-Origin to their answers, for allowed origins
// only. A request from any other origin is served as before, without CORS headers, so the
// browser keeps the answer from the page. No route allows credentials (cookies): the browser-
// facing routes need none.
type corsPolicy struct {
	any     bool            // "*": every origin
	origins map[string]bool // exact origins, e.g. "https://app.example.com"
	paths   map[string]bool // the routes it applies to, by exact path
}

// corsMaxAge is how long, in seconds, a browser may cache a preflight's answer.
const corsMaxAge = "600"

// newCORSPolicy allows origins (a "*" entry allows any; "self" stands for selfOrigins) on
// paths.
func newCORSPolicy(origins, selfOrigins, paths []string) *corsPolicy {
	p := &corsPolicy{origins: map[string]bool{}, paths: map[string]bool{}}
	for _, o := range origins {
		switch o = strings.TrimRight(strings.TrimSpace(o), "/"); o {
		case "":
		case "*":
			p.any = true
		case "self":
			for _, s := range selfOrigins {
				p.origins[s] = true
			}
		default:
			p.origins[o] = true
		}
	}
	for _, path := range paths {
		p.paths[path] = true
	}
	return p
}

// allows reports whether a page of origin may read the routes' answers.
func (p *corsPolicy) allows(origin string) bool { return p.any || p.origins[origin] }

// wrap serves next, applying the policy to its paths.
func (p *corsPolicy) wrap(next http.Handler) http.Handler {
	if !p.any && len(p.origins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.paths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		origin := r.Header.Get("Origin")
		h := w.Header()
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			if origin != "" && p.allows(origin) {
				p.allowOrigin(h, origin)
				h.Set("Access-Control-Allow-Methods", "GET, OPTIONS")
				if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
					h.Set("Access-Control-Allow-Headers", req)
				}
				h.Set("Access-Control-Max-Age", corsMaxAge)
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if origin != "" && p.allows(origin) {
			p.allowOrigin(h, origin)
		}
		next.ServeHTTP(w, r)
	})
}

func (p *corsPolicy) allowOrigin(h http.Header, origin string) {
	if p.any {
		h.Set("Access-Control-Allow-Origin", "*")
		return
	}
	h.Set("Access-Control-Allow-Origin", origin)
}

// selfOrigins are the origins of an endpoint listening on addr: its address, and for a
// loopback or unspecified host the loopback names a browser on this machine uses too.
func selfOrigins(scheme string, addr net.Addr) []string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return nil
	}
	hosts := []string{host}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		hosts = append(hosts, "localhost", "127.0.0.1", "::1")
	}
	var out []string
	for _, h := range hosts {
		o := scheme + "://" + net.JoinHostPort(h, port)
		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}
