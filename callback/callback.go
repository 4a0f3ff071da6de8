// Package callback asks an app's own backend about its members' logins and sends: signed HTTP
// POSTs to per-app webhooks (docs/callbacks.md) whose JSON answer allows, denies, overrides a
// login's tags or rewrites a message. It guards the platform against those backends: every
// app's hook has its own timeout, bounded pool of calls and circuit breaker, and a failure
// policy decides what a call that got no answer means (fail-open or fail-closed). Nothing waits
// on a call: the caller hands a function that receives the decision, so a slow backend of one
// app holds only that app's pool.
//
// It does not decide who may log in or send on the platform's side (bans, mutes, tag
// permissions are the room service's) and it does not answer anybody: the room service calls it
// for the logins and sends it admitted, and answers with the decision.
package callback

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Hook names a callback: what a platform event the app's backend is asked about.
type Hook string

// The hooks.
const (
	HookLogin Hook = "login"
	HookSend  Hook = "send"
)

// Failure kinds: why a call got no answer the decision could follow. The first four count
// against the breaker.
const (
	FailTimeout     = "timeout"      // no answer within the app's Timeout
	FailTransport   = "transport"    // no connection, reset, TLS failure
	FailStatus      = "status"       // an HTTP status other than 200
	FailBadAnswer   = "bad_answer"   // 200 with a body that is not a valid answer
	FailBreakerOpen = "breaker_open" // not called: the breaker is open
	FailRejected    = "rejected"     // not called: the hook's calls and queue are full, or it waited too long
	FailClosing     = "closing"      // not called: the client is shutting down
)

// The lanes of a send's request and answer, as roomcast's Lane numbers them: a greater number
// is a lower lane.
const (
	laneCritical = 1
	laneBulk     = 3
)

// maxAnswerBytes bounds an answer's body; a longer one is a bad answer.
const maxAnswerBytes = 64 << 10

// Config configures a Client.
type Config struct {
	// Apps maps an app to its callbacks. An app not in it is never called back.
	Apps map[string]AppConfig
	// Log receives the client's logs (breaker changes, failures at debug level). Zero value
	// means none.
	Log *slog.Logger
	// Registerer receives the metrics (metrics.go). Zero value means they are kept unregistered.
	Registerer prometheus.Registerer
	// Now is the clock of the breakers and of the signatures' timestamps. Zero value means
	// time.Now.
	Now func() time.Time
	// HTTP makes the calls. Zero value means a client of the package's own (each call is
	// bounded by its app's Timeout).
	HTTP *http.Client
	// MaxBodyBytes and MaxTypeBytes bound a rewritten message's body and type: a longer rewrite
	// is a bad answer. Zero values mean 16 KiB and 32 bytes (the room service's limits).
	MaxBodyBytes, MaxTypeBytes int
}

func (c Config) withDefaults() (Config, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{
			Transport: &http.Transport{
				Proxy:               http.ProxyFromEnvironment,
				MaxIdleConnsPerHost: 64,
				IdleConnTimeout:     90 * time.Second,
			},
			// A redirect is a status failure: the signed request goes to the URL configured
			// and nowhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 16 << 10
	}
	if c.MaxTypeBytes <= 0 {
		c.MaxTypeBytes = 32
	}
	apps := make(map[string]AppConfig, len(c.Apps))
	for app, a := range c.Apps {
		var err error
		if apps[app], err = a.withDefaults(); err != nil {
			return c, fmt.Errorf("callback: app %q: %w", app, err)
		}
	}
	c.Apps = apps
	return c, nil
}

// Client calls the apps' hooks. Its methods may be called from any goroutine.
type Client struct {
	cfg       Config
	m         *metrics
	endpoints atomic.Pointer[map[endpointKey]*endpoint] // the hooks in force: cfg.Apps's, until SetApps
	setMu     sync.Mutex                                // serializes SetApps

	ctx    context.Context // ends the calls in flight at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the calls' goroutines
	mu     sync.RWMutex   // guards closed; held for reading while a call is handed on, so that Close waits for it
	closed bool
}

type endpointKey struct {
	app  string
	hook Hook
}

// New returns a client for the apps of cfg.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg}
	if c.m, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.endpoints.Store(c.buildEndpoints(cfg.Apps, nil))
	return c, nil
}

// buildEndpoints returns the endpoints of apps (whose defaults are filled in), keeping those of
// old whose app, hook and configuration did not change: their breakers and calls in flight go
// on.
func (c *Client) buildEndpoints(apps map[string]AppConfig, old map[endpointKey]*endpoint) *map[endpointKey]*endpoint {
	names := make([]string, 0, len(apps))
	for app := range apps {
		names = append(names, app)
	}
	sort.Strings(names)
	eps := map[endpointKey]*endpoint{}
	for _, app := range names {
		a := apps[app]
		for hook, url := range map[Hook]string{HookLogin: a.LoginURL, HookSend: a.SendURL} {
			if url == "" {
				continue
			}
			key := endpointKey{app, hook}
			if e := old[key]; e != nil && e.url == url && sameSettings(e.cfg, a) {
				eps[key] = e
			} else {
				eps[key] = c.newEndpoint(app, hook, url, a)
			}
		}
	}
	return &eps
}

// sameSettings says whether two configurations of an app set a hook the same, whatever the
// other hook's URL.
func sameSettings(a, b AppConfig) bool {
	a.LoginURL, a.SendURL, b.LoginURL, b.SendURL = "", "", "", ""
	return reflect.DeepEqual(a, b)
}

// SetApps replaces the apps' callbacks: calls made after it returns go to the new hooks; calls
// in flight finish where they went. A hook whose configuration did not change keeps its
// breaker. A configuration that New would refuse is refused, and the callbacks in force stay.
func (c *Client) SetApps(apps map[string]AppConfig) error {
	filled := make(map[string]AppConfig, len(apps))
	for app, a := range apps {
		var err error
		if filled[app], err = a.withDefaults(); err != nil {
			return fmt.Errorf("callback: app %q: %w", app, err)
		}
	}
	c.setMu.Lock()
	defer c.setMu.Unlock()
	c.endpoints.Store(c.buildEndpoints(filled, *c.endpoints.Load()))
	return nil
}

// Has reports whether app has a hook.
func (c *Client) Has(app string, hook Hook) bool {
	if c == nil {
		return false
	}
	_, ok := (*c.endpoints.Load())[endpointKey{app, hook}]
	return ok
}

// Close ends the calls in flight (their decisions follow the failure policy) and waits for them;
// later calls are decided by the policy at once. It may be called more than once.
func (c *Client) Close() {
	c.mu.Lock() // no call is being handed on: none starts after Wait begins
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}

// Envelope opens every request's JSON: the hook, the request's id (unique, for an app to tell
// replays apart) and its time. The client fills it in.
type Envelope struct {
	Hook   Hook   `json:"hook"`
	ID     string `json:"id"`
	TimeMs int64  `json:"time_ms"`
}

// LoginRequest is the JSON a login hook receives (docs/callbacks.md).
type LoginRequest struct {
	Envelope
	App       string   `json:"app"`
	Room      string   `json:"room"`
	UID       string   `json:"uid"`
	SessionID string   `json:"session_id"`
	Node      string   `json:"node"`
	Device    string   `json:"device"`
	Tags      []string `json:"tags"`
}

// SendRequest is the JSON a send hook receives (docs/callbacks.md).
type SendRequest struct {
	Envelope
	App        string   `json:"app"`
	Room       string   `json:"room"`
	UID        string   `json:"uid"`
	SessionID  string   `json:"session_id"`
	Type       string   `json:"type"`
	Lane       int32    `json:"lane"`
	Body       []byte   `json:"body"`
	TagExpr    string   `json:"tag_expr,omitempty"`
	SenderTags []string `json:"sender_tags"`
}

// Answer is the JSON a hook answers with (docs/callbacks.md). Allow is required.
type Answer struct {
	Allow  *bool  `json:"allow"`
	Reason string `json:"reason,omitempty"`
	// Login only: when present (even empty), the member's tags for this session.
	Tags *[]string `json:"tags,omitempty"`
	// Send only: when present, the message's new body (base64 in JSON) and type.
	Body []byte  `json:"body,omitempty"`
	Type *string `json:"type,omitempty"`
	// Send only: when present, the lane the message goes on instead (2 normal, 3 bulk): the
	// request's lane or a lower one, never a higher.
	Lane *int32 `json:"lane,omitempty"`
}

// Decision is what a call decided.
type Decision struct {
	// Allow lets the login or the send through.
	Allow bool
	// Failure is "" when the app answered; otherwise the failure kind, and Allow is the hook's
	// failure policy.
	Failure string
	// Reason is the app's reason for a deny.
	Reason string
	// Tags, when not nil, replace the member's tags (a login the app allowed).
	Tags *[]string
	// Body and Type, when not nil, replace the message's (a send the app allowed).
	Body []byte
	Type *string
	// Lane, when not nil, is the lane the message goes on (a send the app allowed): the
	// request's or a lower one (a greater number).
	Lane *int32
}

// Login asks app's login hook about req and hands the decision to done, on another goroutine
// unless the call is not made (breaker open, pool full, closing). It returns false, without
// calling done, when app has no login hook.
func (c *Client) Login(app string, req LoginRequest, done func(Decision)) bool {
	return c.submit(app, HookLogin, &req.Envelope, &req, 0, done)
}

// Send asks app's send hook about req, as Login does.
func (c *Client) Send(app string, req SendRequest, done func(Decision)) bool {
	return c.submit(app, HookSend, &req.Envelope, &req, req.Lane, done)
}

// submit hands a request to its endpoint; env is payload's envelope, stamped as the call goes
// out; lane is a send's lane, which its answer may lower and not raise.
func (c *Client) submit(app string, hook Hook, env *Envelope, payload any, lane int32, done func(Decision)) bool {
	if c == nil {
		return false
	}
	e := (*c.endpoints.Load())[endpointKey{app, hook}]
	if e == nil {
		return false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		e.fail(FailClosing, done)
		return true
	}
	body := func(id string, now time.Time) any {
		*env = Envelope{Hook: hook, ID: id, TimeMs: now.UnixMilli()}
		return payload
	}
	e.submit(job{body: body, done: done, queued: c.cfg.Now(), lane: lane})
	return true
}

// newID returns a request's id: 128 random bits in hex, for an app to tell replays apart.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// call POSTs one request to e's URL and reads the answer. It returns the failure kind, or "".
func (e *endpoint) call(j job) (Answer, string) {
	c := e.c
	now := c.cfg.Now()
	payload, err := json.Marshal(j.body(newID(), now))
	if err != nil {
		e.log.Error("encode callback request", "err", err)
		return Answer{}, FailBadAnswer
	}
	ctx, cancel := context.WithTimeout(c.ctx, e.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(payload))
	if err != nil {
		return Answer{}, FailTransport
	}
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderHook, string(e.hook))
	req.Header.Set(HeaderTimestamp, fmt.Sprint(ts))
	req.Header.Set(HeaderSignature, Sign(e.cfg.Secret, ts, payload))
	start := time.Now()
	resp, err := c.cfg.HTTP.Do(req)
	defer func() { e.m.latency.Observe(time.Since(start).Seconds()) }()
	if err != nil {
		if ctx.Err() != nil {
			return Answer{}, FailTimeout
		}
		return Answer{}, FailTransport
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	switch {
	case err != nil && ctx.Err() != nil:
		return Answer{}, FailTimeout
	case err != nil:
		return Answer{}, FailTransport
	case resp.StatusCode != http.StatusOK:
		e.log.Debug("callback answered with a status", "status", resp.StatusCode)
		return Answer{}, FailStatus
	case len(body) > maxAnswerBytes:
		return Answer{}, FailBadAnswer
	}
	var a Answer
	if err := json.Unmarshal(body, &a); err != nil {
		e.log.Debug("callback answer does not parse", "err", err)
		return Answer{}, FailBadAnswer
	}
	if err := e.check(&a, j.lane); err != nil {
		e.log.Debug("callback answer refused", "err", err)
		return Answer{}, FailBadAnswer
	}
	return a, ""
}

// errAnswer wraps what is wrong with an answer.
var errAnswer = errors.New("bad answer")

// check refuses an answer that lacks allow or carries what its hook cannot take; lane is the
// send's lane.
func (e *endpoint) check(a *Answer, lane int32) error {
	switch {
	case a.Allow == nil:
		return fmt.Errorf("%w: allow is missing", errAnswer)
	case e.hook == HookLogin && (a.Body != nil || a.Type != nil || a.Lane != nil):
		return fmt.Errorf("%w: a login answer rewrites no message", errAnswer)
	case a.Lane != nil && (*a.Lane < max(lane, laneCritical) || *a.Lane > laneBulk):
		return fmt.Errorf("%w: lane %d is not the message's lane (%d) or a lower one (up to %d, bulk)", errAnswer, *a.Lane, lane, laneBulk)
	case e.hook == HookSend && a.Tags != nil:
		return fmt.Errorf("%w: a send answer sets no tags", errAnswer)
	case a.Body != nil && (len(a.Body) == 0 || len(a.Body) > e.c.cfg.MaxBodyBytes):
		return fmt.Errorf("%w: a rewritten body must be 1 to %d bytes", errAnswer, e.c.cfg.MaxBodyBytes)
	case a.Type != nil && (len(*a.Type) > e.c.cfg.MaxTypeBytes || !utf8.ValidString(*a.Type)):
		return fmt.Errorf("%w: a rewritten type must be valid UTF-8 of at most %d bytes", errAnswer, e.c.cfg.MaxTypeBytes)
	}
	if a.Tags != nil {
		return checkTags(*a.Tags)
	}
	return nil
}
