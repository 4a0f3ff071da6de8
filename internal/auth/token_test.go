package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestMintVerify(t *testing.T) {
	keys := Keyring{"app1": []byte("s1"), "app2": []byte("s2")}
	tok, err := Mint([]byte("s1"), "app1", "u1", "r1", []string{"class:3"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := keys.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.App != "app1" || c.UID != "u1" || c.Room != "r1" || len(c.Tags) != 1 || c.Tags[0] != "class:3" {
		t.Fatalf("claims %+v", c)
	}

	forged, _ := Mint([]byte("s1"), "app2", "u1", "r1", nil, time.Minute) // signed with app1's secret
	none := jwt.NewWithClaims(jwt.SigningMethodNone, Claims{App: "app1", UID: "u", Room: "r",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	noneTok, _ := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{App: "app1", UID: "u", Room: "r"}).SignedString([]byte("s1"))
	unknownApp, _ := Mint([]byte("s1"), "app3", "u1", "r1", nil, time.Minute)
	badRoom, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{App: "app1", UID: "u", Room: "a.b",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}).SignedString([]byte("s1"))
	for name, tok := range map[string]string{
		"wrong secret": forged, "alg none": noneTok, "no expiry": noExp, "unknown app": unknownApp,
		"room with a dot": badRoom, "garbage": "garbage", "empty": "",
	} {
		if _, err := keys.Verify(tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}

	expired, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{App: "app1", UID: "u", Room: "r",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(-time.Minute))}}).SignedString([]byte("s1"))
	if _, err := keys.Verify(expired); !errors.Is(err, ErrExpired) {
		t.Errorf("expired: err %v, want ErrExpired", err)
	}
}

func TestMintRefusesBadInput(t *testing.T) {
	for name, f := range map[string]func() error{
		"empty secret": func() error { _, err := Mint(nil, "a", "u", "r", nil, time.Minute); return err },
		"bad uid":      func() error { _, err := Mint([]byte("s"), "a", "u u", "r", nil, time.Minute); return err },
		"long room": func() error {
			_, err := Mint([]byte("s"), "a", "u", strings.Repeat("r", 129), nil, time.Minute)
			return err
		},
		"zero ttl": func() error { _, err := Mint([]byte("s"), "a", "u", "r", nil, 0); return err },
	} {
		if f() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestAPIKeys(t *testing.T) {
	k := APIKeys{"key-1": "app1"}
	if app, ok := k.App("key-1"); !ok || app != "app1" {
		t.Fatalf("App(key-1) = %q, %v", app, ok)
	}
	for _, bad := range []string{"", "key-2", "key-1 "} {
		if _, ok := k.App(bad); ok {
			t.Errorf("App(%q) accepted", bad)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	keys := Keyring{"demo": []byte("roomcast-dev-secret")}
	tok, err := Mint(keys["demo"], "demo", "user-12345", "room-1", []string{"class:3", "role:student"}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := keys.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVerifyCompactForm covers what Verify reads itself: headers other than the jwt package's
// own, other algorithms, the time claims and malformed segments.
func TestVerifyCompactForm(t *testing.T) {
	secret := []byte("s1")
	keys := Keyring{"app1": secret}
	hour := jwt.NewNumericDate(time.Now().Add(time.Hour))
	sign := func(m jwt.SigningMethod, header map[string]any, c jwt.Claims, key any) string {
		t.Helper()
		tok := jwt.NewWithClaims(m, c)
		for k, v := range header {
			tok.Header[k] = v
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ok := Claims{App: "app1", UID: "u", Room: "r", RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: hour}}

	// Good tokens with headers other than {"alg":"HS256","typ":"JWT"}.
	for name, h := range map[string]map[string]any{
		"with kid": {"kid": "k1"},
		"no typ":   {"typ": nil},
	} {
		tok := sign(jwt.SigningMethodHS256, h, ok, secret)
		if h["typ"] == nil {
			// jwt always writes typ; drop it by re-encoding the header.
			parts := strings.Split(tok, ".")
			parts[0] = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256"}`))
			mac := hmac.New(sha256.New, secret)
			mac.Write([]byte(parts[0] + "." + parts[1]))
			tok = parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
		}
		if c, err := keys.Verify(tok); err != nil || c.UID != "u" || !c.ExpiresAt.Equal(hour.Time) {
			t.Errorf("%s: claims %+v, err %v", name, c, err)
		}
	}

	notYet := ok
	notYet.NotBefore = hour
	goodSig := sign(jwt.SigningMethodHS256, nil, ok, secret)
	parts := strings.Split(goodSig, ".")
	for name, tok := range map[string]string{
		"HS512":          sign(jwt.SigningMethodHS512, nil, ok, secret),
		"crit header":    sign(jwt.SigningMethodHS256, map[string]any{"crit": []string{"exp"}}, ok, secret),
		"not valid yet":  sign(jwt.SigningMethodHS256, nil, notYet, secret),
		"two segments":   parts[0] + "." + parts[1],
		"four segments":  goodSig + ".x",
		"bad base64 sig": parts[0] + "." + parts[1] + ".!!!",
		"bad claims":     parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"app":"app1","exp":"soon"}`)) + "." + parts[2],
		"too long":       parts[0] + "." + strings.Repeat("A", maxTokenLen) + "." + parts[2],
		"cut signature":  goodSig[:len(goodSig)-2],
	} {
		if _, err := keys.Verify(tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "A-z_09", strings.Repeat("x", 128)} {
		if !ValidName(ok) {
			t.Errorf("ValidName(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>", "é", "a\n", strings.Repeat("x", 129)} {
		if ValidName(bad) {
			t.Errorf("ValidName(%q) = true", bad)
		}
	}
}
