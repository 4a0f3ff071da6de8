// Package auth mints and verifies the tokens clients present at login, and checks server API
// keys. Tokens are JWTs signed with HMAC-SHA256 by the app server with the app's secret; a
// ChatLink verifies them locally, without asking any service.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/golang-jwt/jwt/v5"
)

// ErrExpired is returned by Verify for a token whose signature is good but whose time is up.
var ErrExpired = errors.New("auth: token expired")

// ErrInvalid wraps every other reason a token is refused.
var ErrInvalid = errors.New("auth: invalid token")

// ValidName reports whether s may be used as an app id, room id or uid: 1 to 128 characters of
// A-Z a-z 0-9 _ -. Names become parts of NATS subjects and URLs, so no dots, spaces or
// wildcards. (A loop, not a regexp: a login checks three names.)
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

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

// maxTokenLen bounds the tokens Verify looks at; a login frame is smaller still.
const maxTokenLen = 4096

// stdHeader is the encoded header that every HS256 token minted by the jwt package carries,
// {"alg":"HS256","typ":"JWT"}: Verify accepts it without decoding.
const stdHeader = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"

// validator checks the registered claims of a token whose signature is good.
var validator = jwt.NewValidator(jwt.WithExpirationRequired())

// Verify checks token's signature with its app's secret and its expiry, and returns its claims.
// The error is ErrExpired or wraps ErrInvalid.
//
// Only HS256 is accepted, so Verify reads the compact form itself instead of through
// jwt.Parse: a ChatLink verifies a token at every login, and the generic parser's header map,
// reflection and per-call HMAC cost about 3 KB of garbage and 7 µs each (BenchmarkVerify).
// The claims are checked by the jwt package's validator.
func (k Keyring) Verify(token string) (*Claims, error) {
	if len(token) > maxTokenLen {
		return nil, fmt.Errorf("%w: token longer than %d bytes", ErrInvalid, maxTokenLen)
	}
	header, rest, ok1 := strings.Cut(token, ".")
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.IndexByte(sig, '.') >= 0 {
		return nil, fmt.Errorf("%w: not a JWT in compact form", ErrInvalid)
	}
	if header != stdHeader {
		hdr, err := decodeSegment(make([]byte, len(header)), header)
		if err != nil {
			return nil, fmt.Errorf("%w: header: %v", ErrInvalid, err)
		}
		if !isHS256(hdr) {
			return nil, fmt.Errorf("%w: header %q: only alg HS256 is accepted", ErrInvalid, hdr)
		}
	}
	body, err := decodeSegment(make([]byte, len(payload)), payload)
	if err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrInvalid, err)
	}
	var w wireClaims
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrInvalid, err)
	}
	c := w.claims()
	secret, ok := k[c.App]
	if !ok {
		return nil, fmt.Errorf("%w: unknown app %q", ErrInvalid, c.App)
	}
	var macBuf [64]byte
	mac, err := decodeSegment(macBuf[:], sig)
	if err != nil || !hmacs.verify(secret, token[:len(header)+1+len(payload)], mac) {
		return nil, fmt.Errorf("%w: signature", ErrInvalid)
	}
	if err := validator.Validate(c); err != nil {
		if errors.Is(err, jwt.ErrTokenExpired) {
			return nil, ErrExpired
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !ValidName(c.App) || !ValidName(c.UID) || !ValidName(c.Room) {
		return nil, fmt.Errorf("%w: app, uid and room must be valid names", ErrInvalid)
	}
	return c, nil
}

// wireClaims is the claims set as Verify decodes it: the registered time claims as plain
// numbers, which jwt.NumericDate would decode through an extra json.Unmarshal each.
type wireClaims struct {
	App  string   `json:"app"`
	UID  string   `json:"uid"`
	Room string   `json:"room"`
	Tags []string `json:"tags"`
	Sub  string   `json:"sub"`
	Iss  string   `json:"iss"`
	Jti  string   `json:"jti"`
	Exp  seconds  `json:"exp"`
	Nbf  seconds  `json:"nbf"`
	Iat  seconds  `json:"iat"`
	// aud is not read: no audience is checked.
}

func (w *wireClaims) claims() *Claims {
	return &Claims{
		App: w.App, UID: w.UID, Room: w.Room, Tags: w.Tags,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject: w.Sub, Issuer: w.Iss, ID: w.Jti,
			ExpiresAt: w.Exp.date(), NotBefore: w.Nbf.date(), IssuedAt: w.Iat.date(),
		},
	}
}

// seconds is a JWT NumericDate: seconds since the epoch, possibly fractional, or absent.
type seconds struct {
	v   float64
	set bool
}

func (s *seconds) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = seconds{}
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("bad NumericDate %s", b)
	}
	*s = seconds{v, true}
	return nil
}

func (s seconds) date() *jwt.NumericDate {
	if !s.set {
		return nil
	}
	whole, frac := math.Modf(s.v)
	return jwt.NewNumericDate(time.Unix(int64(whole), int64(frac*1e9)))
}

// decodeSegment decodes one base64url segment of a token into buf.
func decodeSegment(buf []byte, seg string) ([]byte, error) {
	enc := base64.RawURLEncoding
	if enc.DecodedLen(len(seg)) > len(buf) {
		return nil, errors.New("segment too long")
	}
	n, err := enc.Decode(buf, unsafe.Slice(unsafe.StringData(seg), len(seg))) // Decode only reads src
	return buf[:n], err
}

// isHS256 reports whether a JOSE header names HS256 and nothing the verifier would have to
// understand (such as "crit").
func isHS256(hdr []byte) bool {
	var h struct {
		Alg  string `json:"alg"`
		Typ  string `json:"typ"`
		Crit []any  `json:"crit"`
	}
	if json.Unmarshal(hdr, &h) != nil {
		return false
	}
	return h.Alg == "HS256" && (h.Typ == "" || h.Typ == "JWT") && h.Crit == nil
}

// hmacs keeps HMAC-SHA256 states per secret for reuse: keying a new one costs two SHA-256
// states and the padded key.
var hmacs = hmacPools{pools: map[string]*sync.Pool{}}

type hmacPools struct {
	mu    sync.RWMutex
	pools map[string]*sync.Pool // by secret
}

// verify reports whether mac is the HMAC-SHA256 of msg under secret, in constant time.
func (p *hmacPools) verify(secret []byte, msg string, mac []byte) bool {
	p.mu.RLock()
	pool := p.pools[string(secret)]
	p.mu.RUnlock()
	if pool == nil {
		key := bytes.Clone(secret)
		pool = &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}
		p.mu.Lock()
		if p.pools[string(key)] == nil {
			p.pools[string(key)] = pool
		} else {
			pool = p.pools[string(key)]
		}
		p.mu.Unlock()
	}
	h := pool.Get().(hash.Hash)
	defer pool.Put(h)
	h.Reset()
	_, _ = h.Write(unsafe.Slice(unsafe.StringData(msg), len(msg))) // Write only reads
	var sum [sha256.Size]byte
	return hmac.Equal(h.Sum(sum[:0]), mac)
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
