package auth

import (
	"slices"
	"testing"
)

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	k := APIKeys{"key-1": {App: "app1"}, "key-2": {App: "app2", Scopes: []string{"read"}}}
	if g, ok := k.Lookup("key-1"); !ok || g.App != "app1" || !g.Allows("send") || !g.Allows("admin") {
		t.Fatalf("Lookup(key-1) = %+v, %v; want app1 with every scope", g, ok)
	}
	if g, ok := k.Lookup("key-2"); !ok || g.App != "app2" || !g.Allows("read") || g.Allows("send") {
		t.Fatalf("Lookup(key-2) = %+v, %v; want app2 with read only", g, ok)
	}
	for _, bad := range []string{"", "key-3", "key-1 "} {
		if _, ok := k.Lookup(bad); ok {
			t.Errorf("Lookup(%q) accepted", bad)
		}
	}
}

func TestParseAPIKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, key, app string
		scopes       []string
	}{
		{"k=demo", "k", "demo", nil},
		{"k=demo:send", "k", "demo", []string{"send"}},
		{"k:x=demo:send,read", "k:x", "demo", []string{"send", "read"}},
	} {
		key, g, err := ParseAPIKey(tc.in)
		if err != nil || key != tc.key || g.App != tc.app || !slices.Equal(g.Scopes, tc.scopes) {
			t.Errorf("ParseAPIKey(%q) = %q %+v %v, want %q %q %q", tc.in, key, g, err, tc.key, tc.app, tc.scopes)
		}
	}
	for _, bad := range []string{"", "k", "=demo", "k=", "k=de.mo", "k=demo:", "k=demo:send,,read", "k=:send"} {
		if _, _, err := ParseAPIKey(bad); err == nil {
			t.Errorf("ParseAPIKey(%q) accepted", bad)
		}
	}
}
