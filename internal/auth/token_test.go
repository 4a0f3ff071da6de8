package auth

import (
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
