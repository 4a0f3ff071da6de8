package auth

import (
	"crypto/subtle"
	"fmt"
	"slices"
	"strings"
)

// APIKey is what a server API key grants: the app it acts for and the scopes of calls it may
// make. The server API (package api) names the scopes and decides which call needs which.
type APIKey struct {
	// App is the app every call made with the key acts for.
	App string
	// Scopes are the scopes the key may use. Zero value (none listed) means every scope: keys
	// configured before scopes existed keep doing everything their app can.
	Scopes []string
}

// Allows reports whether the key may make calls of scope.
func (k APIKey) Allows(scope string) bool {
	return len(k.Scopes) == 0 || slices.Contains(k.Scopes, scope)
}

// APIKeys maps a server API key to what it grants.
type APIKeys map[string]APIKey

// Lookup returns what key grants. It compares in constant time.
func (k APIKeys) Lookup(key string) (APIKey, bool) {
	var grant APIKey
	found := false
	for candidate, g := range k {
		if subtle.ConstantTimeCompare([]byte(candidate), []byte(key)) == 1 {
			grant, found = g, true
		}
	}
	return grant, found
}

// ParseAPIKey parses a key's configuration, "KEY=APP" (every scope) or "KEY=APP:SCOPE,SCOPE"
// (those scopes only). It checks the app's name; the caller checks the scopes' names.
func ParseAPIKey(s string) (key string, grant APIKey, err error) {
	key, v, ok := strings.Cut(s, "=")
	if !ok || key == "" || v == "" {
		return "", APIKey{}, fmt.Errorf("want KEY=APP or KEY=APP:SCOPE,SCOPE, got %q", s)
	}
	app, scopes, hasScopes := strings.Cut(v, ":")
	if !ValidName(app) {
		return "", APIKey{}, fmt.Errorf("API key for %q: the app must be 1-128 characters of A-Z a-z 0-9 _ -", app)
	}
	grant.App = app
	if hasScopes {
		for _, sc := range strings.Split(scopes, ",") {
			if sc == "" {
				return "", APIKey{}, fmt.Errorf("API key for %q: empty scope in %q", app, scopes)
			}
			grant.Scopes = append(grant.Scopes, sc)
		}
	}
	return key, grant, nil
}
