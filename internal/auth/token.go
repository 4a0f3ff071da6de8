// Package auth mints and verifies the tokens clients present at login, and checks server API
// keys. Tokens are JWTs signed with HMAC-SHA256 by the app server with the app's secret; a
// ChatLink verifies them locally, without asking any service.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
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

// ErrLifetime wraps ErrInvalid for a token whose exp is further ahead than its app's maximum
// token lifetime (Lifetimes): a reason worth telling the client, whose app mints such tokens.
var ErrLifetime = fmt.Errorf("%w: valid for longer than the app's maximum token lifetime", ErrInvalid)

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
	// Lanes are the lanes the member may send on beyond normal and bulk, which every member
	// may: "critical" is the only one (LaneCritical). Without it, the room's critical_expr
	// decides (docs/protocol.md).
	Lanes []string `json:"lanes,omitempty"`
	jwt.RegisteredClaims
}

// LaneCritical, in a token's lanes, lets the member send critical messages.
const LaneCritical = "critical"

// MintOption adds to the claims a token is minted with.
type MintOption func(*Claims)

// WithLanes grants the member lanes beyond normal and bulk (LaneCritical).
func WithLanes(lanes ...string) MintOption {
	return func(c *Claims) { c.Lanes = lanes }
}

// Mint signs a token for uid in room of app, valid for ttl.
func Mint(secret []byte, app, uid, room string, tags []string, ttl time.Duration, opts ...MintOption) (string, error) {
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
	for _, o := range opts {
		o(&c)
	}
	if err := checkLanes(c.Lanes); err != nil {
		return "", err
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// Keyring maps an app id to its token secret.
type Keyring map[string][]byte

// DefaultMaxLifetime is how far ahead of now a token's exp may be, for an app that sets no
// lifetime of its own (Lifetimes).
const DefaultMaxLifetime = 24 * time.Hour

// Lifetimes maps an app id to the longest its tokens may still be valid: a token whose exp is
// further ahead of now is refused, so a token minted by mistake to last for years (or a leaked
// one) does not. (An exp in milliseconds is past the year 9999 and refused as a bad date.) An
// app not in it, or with a lifetime of zero, gets DefaultMaxLifetime.
type Lifetimes map[string]time.Duration

// of returns app's maximum token lifetime.
func (l Lifetimes) of(app string) time.Duration {
	if d := l[app]; d > 0 {
		return d
	}
	return DefaultMaxLifetime
}

// maxTokenLen bounds the tokens Verify looks at; a login frame is smaller still.
const maxTokenLen = 4096

// stdHeader is the encoded header that every HS256 token minted by the jwt package carries,
// {"alg":"HS256","typ":"JWT"}: Verify accepts it without decoding.
const stdHeader = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"

// validator checks the registered claims of a token whose signature is good.
var validator = jwt.NewValidator(jwt.WithExpirationRequired())

// Verify is VerifyWithin with DefaultMaxLifetime for every app.
func (k Keyring) Verify(token string) (*Claims, error) { return k.VerifyWithin(token, nil) }

// VerifyWithin checks token's signature with its app's secret, its expiry, and that its exp is
// no further ahead than the app's maximum lifetime in max, and returns its claims. The error
// is ErrExpired or wraps ErrInvalid.
//
// Only HS256 is accepted, so Verify reads the compact form itself instead of through
// jwt.Parse: a ChatLink verifies a token at every login, and the generic parser builds a
// header map by reflection and keys a new HMAC each call, where Verify reuses HMAC states
// (BenchmarkVerify). The claims are decoded with exact member names (wireClaims.decode) and
// checked by the jwt package's validator.
func (k Keyring) VerifyWithin(token string, max Lifetimes) (*Claims, error) {
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
		if err := checkHS256(hdr); err != nil {
			return nil, fmt.Errorf("%w: header %q: %v", ErrInvalid, hdr, err)
		}
	}
	body, err := decodeSegment(make([]byte, len(payload)), payload)
	if err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrInvalid, err)
	}
	var w wireClaims
	if !w.decodePlain(body) {
		w = wireClaims{}
		if err := w.decode(body); err != nil {
			return nil, fmt.Errorf("%w: claims: %v", ErrInvalid, err)
		}
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
	if limit := max.of(c.App); time.Until(c.ExpiresAt.Time) > limit {
		return nil, fmt.Errorf("%w: exp %s is more than %v ahead", ErrLifetime, c.ExpiresAt.UTC().Format(time.RFC3339), limit)
	}
	if !ValidName(c.App) || !ValidName(c.UID) || !ValidName(c.Room) {
		return nil, fmt.Errorf("%w: app, uid and room must be valid names", ErrInvalid)
	}
	if err := checkLanes(c.Lanes); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return c, nil
}

// checkLanes refuses a lanes claim naming anything but LaneCritical: a token that means to
// grant something this version does not know is refused rather than half read.
func checkLanes(lanes []string) error {
	for _, l := range lanes {
		if l != LaneCritical {
			return fmt.Errorf("auth: lanes: %q is not a lane a token grants (only %q)", l, LaneCritical)
		}
	}
	return nil
}

// Critical reports whether the token grants its member the critical lane.
func (c *Claims) Critical() bool { return slices.Contains(c.Lanes, LaneCritical) }

// wireClaims is the claims set as Verify decodes it: the registered time claims as plain
// numbers, which jwt.NumericDate would decode through an extra json.Unmarshal each.
type wireClaims struct {
	App   string
	UID   string
	Room  string
	Tags  []string
	Lanes []string
	Sub   string
	Iss   string
	Jti   string
	Exp   seconds
	Nbf   seconds
	Iat   seconds
	// aud is not read: no audience is checked.
}

// claimNames are the claims Verify reads, in the order of wireClaims.targets.
var claimNames = []string{"app", "uid", "room", "tags", "lanes", "sub", "iss", "jti", "exp", "nbf", "iat"}

// targets returns where each claim of claimNames is decoded to.
func (w *wireClaims) targets() []any {
	return []any{&w.App, &w.UID, &w.Room, &w.Tags, &w.Lanes, &w.Sub, &w.Iss, &w.Jti, &w.Exp, &w.Nbf, &w.Iat}
}

// decode reads a claims set: a JSON object whose known members are named exactly, each at
// most once. Names match exactly: encoding/json's struct decoding would also take "ROOM",
// "Uid" or "tagſ" (U+017F folds to s) for a field, so an extra claim could override a signed
// one. A member whose name folds to a known one is refused rather than ignored: no issuer of
// ours writes one, so it can only be an attempt to confuse a reader that folds case.
func (w *wireClaims) decode(body []byte) error {
	return decodeObject(body, claimNames, w.targets())
}

// decodeObject decodes the JSON object in data member by member: the member named known[i]
// goes to dst[i], and other members are skipped. Known names must match exactly and appear
// once; the object must be the whole of data.
func decodeObject(data []byte, known []string, dst []any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	var seen uint64 // bit i: known[i] was decoded
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		name := t.(string) // inside an object, More then Token yields a member name
		i := slices.Index(known, name)
		if i < 0 {
			for _, k := range known {
				if strings.EqualFold(name, k) {
					return fmt.Errorf("member %q is not %q: names are case-sensitive", name, k)
				}
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		if seen&(1<<i) != 0 {
			return fmt.Errorf("member %q appears twice", name)
		}
		seen |= 1 << i
		if err := dec.Decode(dst[i]); err != nil {
			return fmt.Errorf("member %q: %w", name, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

func (w *wireClaims) claims() *Claims {
	return &Claims{
		App: w.App, UID: w.UID, Room: w.Room, Tags: w.Tags, Lanes: w.Lanes,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject: w.Sub, Issuer: w.Iss, ID: w.Jti,
			ExpiresAt: w.Exp.date(), NotBefore: w.Nbf.date(), IssuedAt: w.Iat.date(),
		},
	}
}

// maxDate is the last second of the year 9999, the latest date Verify accepts in a token. Dates
// are range-checked before they become int64 nanoseconds: 9.3e18 seconds would overflow and
// wrap into the past, making a far-future nbf valid at once.
const maxDate = 253402300799

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
	v, ok := parseSeconds(string(b))
	if !ok {
		return fmt.Errorf("bad NumericDate %s: want seconds from 0 to %d", b, int64(maxDate))
	}
	*s = v
	return nil
}

// parseSeconds reads a NumericDate's literal, from 0 to maxDate.
func parseSeconds(lit string) (seconds, bool) {
	v, err := strconv.ParseFloat(lit, 64)
	if err != nil || !(0 <= v && v <= maxDate) { // also false for NaN
		return seconds{}, false
	}
	return seconds{v, true}, true
}

func (s seconds) date() *jwt.NumericDate {
	if !s.set {
		return nil
	}
	whole, frac := math.Modf(s.v)
	return jwt.NewNumericDate(time.Unix(int64(whole), int64(frac*1e9)))
}

// decodeSegment decodes one base64url segment of a token into buf. Only the canonical form
// is accepted: the URL alphabet without padding or whitespace (encoding/base64 skips CR and LF
// anywhere), and zero unused bits in the last character (Strict). Otherwise several strings
// would carry the same signature, defeating a deny list or replay cache keyed on the token.
func decodeSegment(buf []byte, seg string) ([]byte, error) {
	enc := base64.RawURLEncoding.Strict()
	if enc.DecodedLen(len(seg)) > len(buf) {
		return nil, errors.New("segment too long")
	}
	for i := 0; i < len(seg); i++ {
		if !isURLBase64(seg[i]) {
			return nil, fmt.Errorf("byte %#x at %d is not base64url", seg[i], i)
		}
	}
	n, err := enc.Decode(buf, unsafe.Slice(unsafe.StringData(seg), len(seg))) // Decode only reads src
	return buf[:n], err
}

func isURLBase64(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// checkHS256 checks that a JOSE header names HS256 and nothing the verifier would have to
// understand (such as "crit"). Member names match exactly, as in the claims.
func checkHS256(hdr []byte) error {
	var alg, typ string
	var crit json.RawMessage
	err := decodeObject(hdr, []string{"alg", "typ", "crit"}, []any{&alg, &typ, &crit})
	switch {
	case err != nil:
		return err
	case alg != "HS256":
		return errors.New("only alg HS256 is accepted")
	case typ != "" && typ != "JWT":
		return fmt.Errorf("typ %q is not JWT", typ)
	case crit != nil:
		return errors.New("crit is not supported")
	}
	return nil
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
