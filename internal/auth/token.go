// Package auth mints and verifies the tokens clients present at login, and checks server API
// keys. Tokens are JWTs signed with HMAC-SHA256 by the app server with the app's secret; a
// ChatLink verifies them locally, without asking any service.
package auth

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// ErrExpired is returned by Verify for a token whose signature is good but whose time is up.
var ErrExpired = errors.New("auth: token expired")

// ErrInvalid wraps every other reason a token is refused.
var ErrInvalid = errors.New("auth: invalid token")

// namePattern is what app ids, room ids and uids may look like: they become parts of NATS
// subjects and URLs, so no dots, spaces or wildcards.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_\-]{1,128}$`)

// ValidName reports whether s may be used as an app id, room id or uid.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// Claims are what a login token says.
type Claims struct {
	App  string   `json:"app"`
	UID  string   `json:"uid"`
	Room string   `json:"room"`
	Tags []string `json:"tags,omitempty"`
	jwt.RegisteredClaims
}

// Mint signs a token for uid in room of app, valid for ttl.
func Mint(secret []byte, app, uid, room string, tags []string, ttl time.Duration) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("auth: empty secret")
	}
	for what, v := range map[string]string{"app": app, "uid": uid, "room": room} {
		if !ValidName(v) {
			return "", fmt.Errorf("auth: %s %q must be 1-128 characters of A-Z a-z 0-9 _ -", what, v)
		}
	}
	if ttl <= 0 {
		return "", errors.New("auth: ttl must be positive")
	}
	now := time.Now()
	c := Claims{
		App: app, UID: uid, Room: room, Tags: tags,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   uid,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// Keyring maps an app id to its token secret.
type Keyring map[string][]byte

// Verify checks token's signature with its app's secret and its expiry, and returns its claims.
// The error is ErrExpired or wraps ErrInvalid.
func (k Keyring) Verify(token string) (*Claims, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		secret, ok := k[c.App]
		if !ok {
			return nil, fmt.Errorf("unknown app %q", c.App)
		}
		return secret, nil
	}, jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired())
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, ErrExpired
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !ValidName(c.App) || !ValidName(c.UID) || !ValidName(c.Room) {
		return nil, fmt.Errorf("%w: app, uid and room must be valid names", ErrInvalid)
	}
	return &c, nil
}

// APIKeys maps a server API key to the app it acts for.
type APIKeys map[string]string

// App returns the app that key belongs to. It compares in constant time.
func (k APIKeys) App(key string) (string, bool) {
	var app string
	found := false
	for candidate, a := range k {
		if subtle.ConstantTimeCompare([]byte(candidate), []byte(key)) == 1 {
			app, found = a, true
		}
	}
	return app, found
}
