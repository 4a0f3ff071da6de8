package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"roomcast/internal/testkit"
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

// TestLanesClaim: a token's lanes claim grants the critical lane, survives Verify on both
// decoding paths, and a lane Verify does not know refuses the token.
func TestLanesClaim(t *testing.T) {
	t.Parallel()
	keys := Keyring{"app1": []byte("s1")}
	plain, _ := Mint([]byte("s1"), "app1", "u1", "r1", nil, time.Minute)
	granted, err := Mint([]byte("s1"), "app1", "u1", "r1", []string{"host"}, time.Minute, WithLanes(LaneCritical))
	if err != nil {
		t.Fatal(err)
	}
	exp := jwt.NewNumericDate(time.Now().Add(time.Hour))
	// A member true is outside decodePlain's shape: this one is read by decodeObject.
	slow, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"app": "app1", "uid": "u", "room": "r",
		"lanes": []string{"critical"}, "exp": exp.Unix(), "x": true}).SignedString([]byte("s1"))
	for name, tc := range map[string]struct {
		tok  string
		want bool
	}{"no claim": {plain, false}, "critical": {granted, true}, "critical, slow path": {slow, true}} {
		c, err := keys.Verify(tc.tok)
		if err != nil || c.Critical() != tc.want {
			t.Errorf("%s: claims %+v, err %v: want Critical() %v", name, c, err, tc.want)
		}
	}
	if _, err := Mint([]byte("s1"), "app1", "u1", "r1", nil, time.Minute, WithLanes("bulk")); err == nil {
		t.Error("Mint granted an unknown lane")
	}
	unknown, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{App: "app1", UID: "u", Room: "r", Lanes: []string{"critical", "turbo"},
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: exp}}).SignedString([]byte("s1"))
	if _, err := keys.Verify(unknown); !errors.Is(err, ErrInvalid) {
		t.Errorf("a token granting lane turbo: err %v, want ErrInvalid", err)
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

func BenchmarkVerify(b *testing.B) {
	keys := Keyring{"demo": []byte("roomcast-dev-secret")}
	tok, err := Mint(keys["demo"], "demo", "user-12345", "room-1", []string{"class:3", "role:student"}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start := testkit.ProcessCPU()
	for b.Loop() {
		if _, err := keys.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
	// CPU per verify, garbage collection included: on a shared machine ns/op also counts
	// waiting for a core.
	b.ReportMetric(float64(testkit.ProcessCPU()-start)/float64(b.N), "cpu-ns/op")
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

// signRaw signs a token whose header and claims are the given JSON texts, exactly as written.
func signRaw(secret []byte, header, claims string) string {
	enc := base64.RawURLEncoding
	msg := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(mac.Sum(nil))
}

// TestVerifyCanonicalOnly checks that a signature verifies in one spelling only: a changed last
// character that differs only in unused bits, a line break inside a segment or at the end of
// the token are all refused (before, encoding/base64 skipped CR and LF and ignored the bits).
func TestVerifyCanonicalOnly(t *testing.T) {
	keys := Keyring{"app1": []byte("s1")}
	tok, err := Mint([]byte("s1"), "app1", "u1", "r1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Verify(tok); err != nil {
		t.Fatal(err)
	}
	// A 32-byte MAC is 43 characters; the last carries 4 bits and 2 unused ones.
	sig := tok[strings.LastIndexByte(tok, '.')+1:]
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	sameBits := string(alphabet[last^1]) // differs in the lowest, unused bit
	for name, bad := range map[string]string{
		"unused bits set":       tok[:len(tok)-1] + sameBits,
		"line feed in the sig":  tok[:len(tok)-5] + "\n" + tok[len(tok)-5:],
		"CR in the claims":      strings.Replace(tok, ".", ".\r", 1),
		"line feed appended":    tok + "\n",
		"CRLF appended":         tok + "\r\n",
		"padding appended":      tok + "=",
		"space in the header":   " " + tok,
		"standard alphabet sig": strings.NewReplacer("-", "+", "_", "/").Replace(tok),
	} {
		if bad == tok {
			continue // the replacer found nothing to change in this token
		}
		if _, err := keys.Verify(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %q verified (err %v)", name, bad, err)
		}
	}
}

const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// TestVerifyDateRange checks that dates too large for a time.Time are a bad token, not valid
// (a far-future nbf wrapped into the past) nor expired (a huge exp wrapped likewise).
func TestVerifyDateRange(t *testing.T) {
	keys := Keyring{"app1": []byte("s1")}
	const h = `{"alg":"HS256","typ":"JWT"}`
	exp := time.Now().Add(time.Hour).Unix()
	for _, nbf := range []string{"9.3e18", "9223372036854775808", "1e300", "-1", "253402300800"} {
		tok := signRaw([]byte("s1"), h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"nbf":%s}`, exp, nbf))
		if _, err := keys.Verify(tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("nbf %s: err %v, want ErrInvalid", nbf, err)
		}
	}
	for _, e := range []string{"9.3e18", "9223372036854775808", "1e300"} {
		tok := signRaw([]byte("s1"), h, `{"app":"app1","uid":"u","room":"r","exp":`+e+`}`)
		if _, err := keys.Verify(tok); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrExpired) {
			t.Errorf("exp %s: err %v, want ErrInvalid", e, err)
		}
	}
	tok := signRaw([]byte("s1"), h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"nbf":1.5}`, exp))
	if _, err := keys.Verify(tok); err != nil {
		t.Errorf("a past nbf with a fraction: %v", err)
	}
}

// TestVerifyExactNames checks that claim and header names match exactly: encoding/json's
// struct decoding folds case (and Unicode: U+017F is an s), so an unsigned-looking extra
// member could stand in for a signed one.
func TestVerifyExactNames(t *testing.T) {
	keys := Keyring{"app1": []byte("s1")}
	exp := time.Now().Add(time.Hour).Unix()
	const h = `{"alg":"HS256","typ":"JWT"}`
	claims := func(extra string) string {
		return fmt.Sprintf(`{"app":"app1","uid":"u1","room":"r1","exp":%d%s}`, exp, extra)
	}
	if c, err := keys.Verify(signRaw([]byte("s1"), h, claims(`,"aud":"x","other":{"a":[1]}`))); err != nil || c.Room != "r1" {
		t.Fatalf("unknown members must be ignored: %+v, %v", c, err)
	}
	for name, tok := range map[string]string{
		"ROOM":                 signRaw([]byte("s1"), h, claims(`,"ROOM":"r2"`)),
		"Uid":                  signRaw([]byte("s1"), h, claims(`,"Uid":"u2"`)),
		"tags with long s":     signRaw([]byte("s1"), h, claims(`,"tagſ":["vip"]`)),
		"EXP":                  signRaw([]byte("s1"), h, claims(`,"EXP":1`)),
		"room twice":           signRaw([]byte("s1"), h, claims(`,"room":"r2"`)),
		"ALG and no alg":       signRaw([]byte("s1"), `{"ALG":"HS256","typ":"JWT"}`, claims("")),
		"alg twice":            signRaw([]byte("s1"), `{"alg":"HS256","alg":"none"}`, claims("")),
		"trailing data":        signRaw([]byte("s1"), h, claims("")+`{}`),
		"claims not an object": signRaw([]byte("s1"), h, `["app1"]`),
	} {
		c, err := keys.Verify(tok)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: claims %+v, err %v, want ErrInvalid", name, c, err)
		}
	}
}

// FuzzVerify feeds Verify arbitrary tokens: it must never panic, and whatever it accepts must
// be the one canonical spelling of a token signed with the app's secret.
func FuzzVerify(f *testing.F) {
	secret := []byte("s1")
	keys := Keyring{"app1": secret}
	good, err := Mint(secret, "app1", "u1", "r1", []string{"vip"}, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	const h = `{"alg":"HS256","typ":"JWT"}`
	exp := time.Now().Add(time.Hour).Unix()
	for _, seed := range []string{
		good, good + "\n", good + "\r\n", good[:len(good)-1] + "l", good[:20] + "\n" + good[20:],
		signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"nbf":9.3e18}`, exp)),
		signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"nbf":1e300}`, exp)),
		signRaw(secret, h, `{"app":"app1","uid":"u","room":"r","exp":9223372036854775808}`),
		signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"ROOM":"r2"}`, exp)),
		signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"Uid":"u2"}`, exp)),
		signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d,"tagſ":["vip"]}`, exp)),
		signRaw(secret, `{"ALG":"HS256"}`, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d}`, exp)),
		"", ".", "..", "a.b.c", strings.Repeat("A", maxTokenLen+1),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := keys.Verify(tok)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExpired) {
				t.Fatalf("error %v is neither ErrInvalid nor ErrExpired", err)
			}
			return
		}
		// Accepted: the token must be the canonical encoding of its parts, signed with secret.
		parts := strings.Split(tok, ".")
		if len(parts) != 3 {
			t.Fatalf("accepted %q with %d parts", tok, len(parts))
		}
		enc := base64.RawURLEncoding
		for _, p := range parts {
			b, err := enc.Strict().DecodeString(p)
			if err != nil || enc.EncodeToString(b) != p {
				t.Fatalf("accepted a non-canonical segment %q of %q", p, tok)
			}
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(parts[0] + "." + parts[1]))
		if enc.EncodeToString(mac.Sum(nil)) != parts[2] {
			t.Fatalf("accepted %q without a good signature", tok)
		}
		if c.App != "app1" || !ValidName(c.UID) || !ValidName(c.Room) {
			t.Fatalf("accepted claims %+v", c)
		}
	})
}

// TestVerifyMaxLifetime checks that a token whose exp is further ahead than its app's maximum
// lifetime is refused with a reason that says so.
func TestVerifyMaxLifetime(t *testing.T) {
	secret := []byte("s1")
	keys := Keyring{"app1": secret, "app2": secret}
	const h = `{"alg":"HS256","typ":"JWT"}`
	claims := func(app string, exp time.Time) string {
		return signRaw(secret, h, fmt.Sprintf(`{"app":%q,"uid":"u","room":"r","exp":%d}`, app, exp.Unix()))
	}
	now := time.Now()
	for _, tc := range []struct {
		name  string
		tok   string
		max   Lifetimes
		valid bool
	}{
		{"an hour, default", claims("app1", now.Add(time.Hour)), nil, true},
		{"just under a day, default", claims("app1", now.Add(DefaultMaxLifetime-time.Minute)), nil, true},
		{"a day and a minute, default", claims("app1", now.Add(DefaultMaxLifetime+time.Minute)), nil, false},
		{"ten years", claims("app1", now.AddDate(10, 0, 0)), nil, false},
		{"a week, app allows 8 days", claims("app1", now.Add(7*24*time.Hour)), Lifetimes{"app1": 8 * 24 * time.Hour}, true},
		{"a week, another app allows 8 days", claims("app2", now.Add(7*24*time.Hour)), Lifetimes{"app1": 8 * 24 * time.Hour}, false},
		{"two hours, app allows one", claims("app1", now.Add(2*time.Hour)), Lifetimes{"app1": time.Hour}, false},
		{"an hour, app's zero lifetime is the default", claims("app1", now.Add(time.Hour)), Lifetimes{"app1": 0}, true},
	} {
		_, err := keys.VerifyWithin(tc.tok, tc.max)
		switch {
		case tc.valid && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.valid && (!errors.Is(err, ErrLifetime) || !errors.Is(err, ErrInvalid)):
			t.Errorf("%s: err %v, want ErrLifetime", tc.name, err)
		}
	}
	// An exp in milliseconds is refused too, as a date past the year 9999.
	millis := signRaw(secret, h, fmt.Sprintf(`{"app":"app1","uid":"u","room":"r","exp":%d}`, now.Add(time.Hour).UnixMilli()))
	if _, err := keys.Verify(millis); !errors.Is(err, ErrInvalid) {
		t.Errorf("exp in milliseconds: err %v, want ErrInvalid", err)
	}
}
