package callback

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"roomcast/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = []byte("0123456789abcdef-test-secret")

// backend is a real HTTP server standing for an app's backend: it verifies each request's
// signature and answers as its current mode says.
type backend struct {
	t           *testing.T
	srv         *httptest.Server
	mu          sync.Mutex // guards mode and answer
	mode        string     // "ok", "fail" (500), "garbage", "hang" (until release, then answer, or until the request ends)
	answer      string     // the JSON of mode "ok"
	calls       atomic.Int64
	bad         atomic.Int64 // requests whose signature did not verify
	release     chan struct{}
	releaseOnce sync.Once
	last        atomic.Value // the last request's body
}

func newBackend(t *testing.T) *backend {
	b := &backend{t: t, mode: "ok", answer: `{"allow":true}`, release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(func() {
		b.unblock()
		b.srv.Close()
	})
	return b
}

func (b *backend) serve(w http.ResponseWriter, r *http.Request) {
	b.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	b.last.Store(body)
	if err := Verify(secret, r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), body, time.Now()); err != nil {
		b.bad.Add(1)
	}
	b.mu.Lock()
	mode, answer := b.mode, b.answer
	b.mu.Unlock()
	switch mode {
	case "ok":
		_, _ = io.WriteString(w, answer)
	case "fail":
		http.Error(w, "down", http.StatusInternalServerError)
	case "garbage":
		_, _ = io.WriteString(w, "<html>oops")
	case "redirect": // to a URL that would allow
		if r.URL.Path != "/elsewhere" {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			return
		}
		_, _ = io.WriteString(w, `{"allow":true}`)
	case "hang":
		select {
		case <-b.release: // answer as the mode set before the release says
			b.mu.Lock()
			answer = b.answer
			b.mu.Unlock()
			_, _ = io.WriteString(w, answer)
		case <-r.Context().Done():
		}
	}
}

func (b *backend) set(mode, answer string) {
	b.mu.Lock()
	b.mode = mode
	if answer != "" {
		b.answer = answer
	}
	b.mu.Unlock()
}

// unblock ends the hanging requests, and makes later ones answer at once in mode "hang".
func (b *backend) unblock() { b.releaseOnce.Do(func() { close(b.release) }) }

// newClient returns a client with app "a" calling b for both hooks, adjusted by edit.
func newClient(t *testing.T, b *backend, reg prometheus.Registerer, edit func(*Config)) *Client {
	t.Helper()
	cfg := Config{Apps: map[string]AppConfig{"a": {
		LoginURL: b.srv.URL + "/login", SendURL: b.srv.URL + "/send", Secret: secret,
		Timeout: 2 * time.Second,
	}}, Registerer: reg}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// editApp edits app "a".
func editApp(f func(*AppConfig)) func(*Config) {
	return func(c *Config) {
		a := c.Apps["a"]
		f(&a)
		c.Apps["a"] = a
	}
}

// login asks app "a"'s login hook and waits for the decision.
func login(t *testing.T, c *Client) Decision {
	t.Helper()
	ch := make(chan Decision, 1)
	if !c.Login("a", LoginRequest{Room: "r", UID: "u", Tags: []string{"t"}}, func(d Decision) { ch <- d }) {
		t.Fatal("no login hook")
	}
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no decision in 10s")
		return Decision{}
	}
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"hook":"login"}`)
	sig := Sign(secret, now.Unix(), body)
	if !strings.HasPrefix(sig, "v1=") || len(sig) != 3+64 {
		t.Fatalf("signature %q: want v1= and 64 hex digits", sig)
	}
	ts := fmt.Sprint(now.Unix())
	for _, tc := range []struct {
		name      string
		ts, sig   string
		body      []byte
		now       time.Time
		secret    []byte
		want      error
		wantNoErr bool
	}{
		{name: "good", ts: ts, sig: sig, body: body, now: now, secret: secret, wantNoErr: true},
		{name: "clock 4m ahead", ts: ts, sig: sig, body: body, now: now.Add(4 * time.Minute), secret: secret, wantNoErr: true},
		{name: "body changed", ts: ts, sig: sig, body: []byte(`{"hook":"send"}`), now: now, secret: secret, want: ErrBadSignature},
		{name: "other secret", ts: ts, sig: sig, body: body, now: now, secret: []byte("another secret of 16+"), want: ErrBadSignature},
		{name: "timestamp changed", ts: fmt.Sprint(now.Unix() + 1), sig: sig, body: body, now: now, secret: secret, want: ErrBadSignature},
		{name: "no v1=", ts: ts, sig: sig[3:], body: body, now: now, secret: secret, want: ErrBadSignature},
		{name: "replayed late", ts: ts, sig: sig, body: body, now: now.Add(ReplayWindow + time.Second), secret: secret, want: ErrStale},
		{name: "from the future", ts: ts, sig: sig, body: body, now: now.Add(-ReplayWindow - time.Second), secret: secret, want: ErrStale},
	} {
		err := Verify(tc.secret, tc.ts, tc.sig, tc.body, tc.now)
		if tc.wantNoErr != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestRequestsAreSignedAndAnswersDecide(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	c := newClient(t, b, nil, nil)
	ask := func(hook Hook) Decision {
		ch := make(chan Decision, 1)
		done := func(d Decision) { ch <- d }
		if hook == HookLogin {
			c.Login("a", LoginRequest{App: "a", Room: "r", UID: "u", Tags: []string{"t"}}, done)
		} else {
			c.Send("a", SendRequest{App: "a", Room: "r", UID: "u", Type: "chat", Lane: 2, Body: []byte("hi")}, done)
		}
		return <-ch
	}
	for _, tc := range []struct {
		name, answer string
		hook         Hook
		check        func(Decision) error
	}{
		{"allow", `{"allow":true}`, HookLogin, func(d Decision) error {
			if !d.Allow || d.Failure != "" || d.Tags != nil {
				return errors.New("want a plain allow")
			}
			return nil
		}},
		{"deny with reason", `{"allow":false,"reason":"not today"}`, HookLogin, func(d Decision) error {
			if d.Allow || d.Failure != "" || d.Reason != "not today" {
				return errors.New("want a deny with the reason")
			}
			return nil
		}},
		{"override tags", `{"allow":true,"tags":["vip","lang:fr"]}`, HookLogin, func(d Decision) error {
			if d.Tags == nil || strings.Join(*d.Tags, ",") != "vip,lang:fr" {
				return errors.New("want tags vip,lang:fr")
			}
			return nil
		}},
		{"clear tags", `{"allow":true,"tags":[]}`, HookLogin, func(d Decision) error {
			if d.Tags == nil || len(*d.Tags) != 0 {
				return errors.New("want empty tags set")
			}
			return nil
		}},
		{"rewrite", `{"allow":true,"body":"KioqKg==","type":"censored"}`, HookSend, func(d Decision) error {
			if string(d.Body) != "****" || d.Type == nil || *d.Type != "censored" {
				return errors.New("want body **** and type censored")
			}
			return nil
		}},
		{"raise", `{"allow":true,"lane":1}`, HookSend, wantFailure(FailBadAnswer)},
		{"no such lane", `{"allow":true,"lane":4}`, HookSend, wantFailure(FailBadAnswer)},
		{"login answer with a lane", `{"allow":true,"lane":3}`, HookLogin, wantFailure(FailBadAnswer)},
		{"demote", `{"allow":true,"lane":3}`, HookSend, func(d Decision) error {
			if !d.Allow || d.Lane == nil || *d.Lane != 3 {
				return errors.New("want lane 3 (bulk)")
			}
			return nil
		}},
		{"lane kept", `{"allow":true,"lane":2}`, HookSend, func(d Decision) error {
			if !d.Allow || d.Lane == nil || *d.Lane != 2 {
				return errors.New("want lane 2 (normal)")
			}
			return nil
		}},
		{"bad tags", `{"allow":true,"tags":["no spaces allowed"]}`, HookLogin, wantFailure(FailBadAnswer)},
		{"allow missing", `{"reason":"x"}`, HookLogin, wantFailure(FailBadAnswer)},
		{"login answer rewriting", `{"allow":true,"body":"eA=="}`, HookLogin, wantFailure(FailBadAnswer)},
		{"send answer with tags", `{"allow":true,"tags":["a"]}`, HookSend, wantFailure(FailBadAnswer)},
		{"empty rewritten body", `{"allow":true,"body":""}`, HookSend, wantFailure(FailBadAnswer)},
		{"rewritten body too long", `{"allow":true,"body":"` + strings.Repeat("A", 4*(16<<10)/3+8) + `"}`, HookSend, wantFailure(FailBadAnswer)},
		{"rewritten type too long", `{"allow":true,"type":"` + strings.Repeat("t", 33) + `"}`, HookSend, wantFailure(FailBadAnswer)},
	} {
		b.set("ok", tc.answer)
		if err := tc.check(ask(tc.hook)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if n := b.bad.Load(); n != 0 {
		t.Fatalf("%d requests did not verify", n)
	}
	var req SendRequest
	if err := json.Unmarshal(b.last.Load().([]byte), &req); err != nil {
		t.Fatal(err)
	}
	if req.Hook != HookSend || len(req.ID) != 32 || req.TimeMs == 0 || string(req.Body) != "hi" || req.Type != "chat" {
		t.Fatalf("send request %+v: want hook, id, time, body and type", req)
	}
}

func wantFailure(kind string) func(Decision) error {
	return func(d Decision) error {
		if d.Failure != kind || !d.Allow { // the default policy is fail-open
			return fmt.Errorf("decision %+v: want failure %s, allowed (fail-open)", d, kind)
		}
		return nil
	}
}

// TestFailurePolicies: each way a backend fails decides by the hook's policy, and is counted
// by its kind.
func TestFailurePolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode, kind string
	}{
		{"fail", FailStatus},
		{"garbage", FailBadAnswer},
		{"hang", FailTimeout},
		{"dead", FailTransport},
		{"redirect", FailStatus},
	} {
		for _, policy := range []Policy{FailOpen, FailClosed} {
			t.Run(tc.mode+"/"+policy.String(), func(t *testing.T) {
				t.Parallel()
				b := newBackend(t)
				b.set(tc.mode, "")
				if tc.mode == "dead" {
					b.srv.Close()
				}
				reg := prometheus.NewRegistry()
				c := newClient(t, b, reg, editApp(func(a *AppConfig) {
					a.LoginPolicy, a.SendPolicy, a.Timeout = policy, FailOpen, 100*time.Millisecond
				}))
				d := login(t, c)
				if d.Failure != tc.kind || d.Allow != (policy == FailOpen) {
					t.Fatalf("decision %+v: want failure %s, allow %v", d, tc.kind, policy == FailOpen)
				}
				if n := testutil.ToFloat64(c.m.failures.WithLabelValues("a", "login", tc.kind)); n != 1 {
					t.Fatalf("failures{kind=%s} = %v, want 1", tc.kind, n)
				}
				decision := map[Policy]string{FailOpen: "fail_open", FailClosed: "fail_closed"}[policy]
				if n := testutil.ToFloat64(c.m.decisions.WithLabelValues("a", "login", decision)); n != 1 {
					t.Fatalf("decisions{%s} = %v, want 1", decision, n)
				}
			})
		}
	}
}

// TestBreakerOpensAndCloses runs a breaker through its states against a backend that fails,
// then recovers, on a clock the test moves.
func TestBreakerOpensAndCloses(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	clock := testkit.NewClock(time.Unix(1_800_000_000, 0))
	c := newClient(t, b, prometheus.NewRegistry(), func(cfg *Config) {
		cfg.Now = clock.Now
		editApp(func(a *AppConfig) {
			a.LoginPolicy = FailClosed
			a.Breaker = BreakerConfig{Failures: 3, FailureRate: 2, OpenFor: 10 * time.Second, Probes: 2}
		})(cfg)
	})
	e := (*c.endpoints.Load())[endpointKey{"a", HookLogin}]
	state := func() float64 { return testutil.ToFloat64(c.m.state.WithLabelValues("a", "login")) }
	expect := func(want breakerState, calls int64) {
		t.Helper()
		if got := e.brk.current(); got != want || state() != float64(want) {
			t.Fatalf("breaker %v (metric %v), want %v", got, state(), want)
		}
		if got := b.calls.Load(); got != calls {
			t.Fatalf("backend called %d times, want %d", got, calls)
		}
	}

	b.set("fail", "")
	for i := range 3 {
		expect(stateClosed, int64(i))
		if d := login(t, c); d.Failure != FailStatus || d.Allow {
			t.Fatalf("call %d: %+v, want a status failure, refused (fail-closed)", i, d)
		}
	}
	expect(stateOpen, 3)
	b.set("ok", `{"allow":true}`) // recovered, but the breaker does not know yet
	for range 5 {
		if d := login(t, c); d.Failure != FailBreakerOpen || d.Allow {
			t.Fatalf("open: %+v, want breaker_open, refused", d)
		}
	}
	expect(stateOpen, 3) // no call went out
	if n := testutil.ToFloat64(c.m.shortCircuited.WithLabelValues("a", "login")); n != 5 {
		t.Fatalf("short-circuited %v, want 5", n)
	}

	clock.Add(10 * time.Second) // half-open: a failed probe opens it again
	b.set("fail", "")
	if d := login(t, c); d.Failure != FailStatus {
		t.Fatalf("probe: %+v, want a status failure", d)
	}
	expect(stateOpen, 4)
	clock.Add(9 * time.Second)
	if d := login(t, c); d.Failure != FailBreakerOpen {
		t.Fatalf("reopened: %+v, want breaker_open", d)
	}

	clock.Add(time.Second) // half-open again: two good probes close it
	b.set("ok", "")
	if d := login(t, c); !d.Allow || d.Failure != "" {
		t.Fatalf("probe 1: %+v, want an allow", d)
	}
	expect(stateHalfOpen, 5)
	if d := login(t, c); !d.Allow || d.Failure != "" {
		t.Fatalf("probe 2: %+v, want an allow", d)
	}
	expect(stateClosed, 6)
	// Closed with a clean count: two failures do not open it.
	b.set("fail", "")
	login(t, c)
	login(t, c)
	expect(stateClosed, 8)
}

// TestBreakerOpensOnRate: failures that never come three in a row still open a breaker whose
// window saw half of its calls fail.
func TestBreakerOpensOnRate(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Unix(1_800_000_000, 0))
	brk := newBreaker(BreakerConfig{Failures: 3, FailureRate: 0.5, Window: 10, OpenFor: time.Second}, nil)
	for i := range 9 {
		brk.record(false, i%2 == 0, clock.Now()) // ok, fail, ok, ... : 4 failures in 9
		if brk.current() != stateClosed {
			t.Fatalf("opened after %d calls", i+1)
		}
	}
	brk.record(false, false, clock.Now()) // the tenth: 5 of 10 failed
	if brk.current() != stateOpen {
		t.Fatalf("breaker %v after 5 of 10 failed, want open", brk.current())
	}
	// A rate above 1 never opens by rate.
	brk = newBreaker(BreakerConfig{Failures: 3, FailureRate: 1.1, Window: 4}, nil)
	for i := range 40 {
		brk.record(false, i%3 == 0, clock.Now())
	}
	if brk.current() != stateClosed {
		t.Fatal("a rate above 1 opened the breaker")
	}
}

// TestConcurrencyLimit: a hook with its calls and queue full decides at once, by the policy,
// without calling.
func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	b.set("hang", "")
	c := newClient(t, b, prometheus.NewRegistry(), editApp(func(a *AppConfig) {
		a.MaxConcurrent, a.MaxQueued, a.LoginPolicy = 2, 1, FailClosed
		a.Timeout = 10 * time.Second
	}))
	results := make(chan Decision, 3)
	for range 3 {
		c.Login("a", LoginRequest{}, func(d Decision) { results <- d })
	}
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if n := b.calls.Load(); n != 2 {
			return fmt.Errorf("%d calls in flight, want 2", n)
		}
		return nil
	})
	if d := login(t, c); d.Failure != FailRejected || d.Allow {
		t.Fatalf("fourth: %+v, want rejected, refused", d)
	}
	if n := testutil.ToFloat64(c.m.rejected.WithLabelValues("a", "login", "full")); n != 1 {
		t.Fatalf("rejected{full} = %v, want 1", n)
	}
	b.set("ok", `{"allow":true}`)
	b.unblock()
	for range 3 {
		if d := <-results; !d.Allow || d.Failure != "" {
			t.Fatalf("queued or in flight: %+v, want an allow", d)
		}
	}
	if n := b.calls.Load(); n != 3 {
		t.Fatalf("backend called %d times, want 3", n)
	}
	// The other hook has a pool of its own, untouched.
	if n := testutil.ToFloat64(c.m.rejected.WithLabelValues("a", "send", "full")); n != 0 {
		t.Fatalf("send hook rejected %v", n)
	}
}

// TestQueuedTooLong: a call that waited in the queue past MaxWait is not made.
func TestQueuedTooLong(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	b.set("hang", "")
	clock := testkit.NewClock(time.Unix(1_800_000_000, 0))
	c := newClient(t, b, prometheus.NewRegistry(), func(cfg *Config) {
		cfg.Now = clock.Now
		editApp(func(a *AppConfig) { a.MaxConcurrent, a.MaxWait, a.Timeout = 1, time.Second, 10*time.Second })(cfg)
	})
	first, second := make(chan Decision, 1), make(chan Decision, 1)
	c.Login("a", LoginRequest{}, func(d Decision) { first <- d })
	c.Login("a", LoginRequest{}, func(d Decision) { second <- d })
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if b.calls.Load() != 1 {
			return errors.New("first call not in flight")
		}
		return nil
	})
	clock.Add(2 * time.Second)
	b.set("ok", `{"allow":true}`)
	b.unblock()
	if d := <-first; !d.Allow || d.Failure != "" {
		t.Fatalf("first: %+v", d)
	}
	if d := <-second; d.Failure != FailRejected {
		t.Fatalf("second: %+v, want rejected after waiting too long", d)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("backend called %d times, want 1", n)
	}
}

// TestCloseEndsCalls: Close cuts hanging calls short, decides them, and later ones at once.
func TestCloseEndsCalls(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	b.set("hang", "")
	c := newClient(t, b, nil, editApp(func(a *AppConfig) { a.Timeout = time.Minute }))
	ch := make(chan Decision, 1)
	c.Login("a", LoginRequest{}, func(d Decision) { ch <- d })
	testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if b.calls.Load() != 1 {
			return errors.New("call not in flight")
		}
		return nil
	})
	c.Close()
	if d := <-ch; d.Failure != FailClosing || !d.Allow {
		t.Fatalf("cut short: %+v, want closing, allowed", d)
	}
	if d := login(t, c); d.Failure != FailClosing {
		t.Fatalf("after Close: %+v", d)
	}
	c.Close()
}

func TestNoHook(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	c := newClient(t, b, nil, editApp(func(a *AppConfig) { a.SendURL = "" }))
	if c.Has("a", HookSend) || c.Send("a", SendRequest{}, func(Decision) { t.Error("called") }) {
		t.Fatal("a hook without a URL")
	}
	if c.Login("b", LoginRequest{}, func(Decision) { t.Error("called") }) {
		t.Fatal("an app without callbacks")
	}
	var none *Client
	if none.Has("a", HookLogin) || none.Login("a", LoginRequest{}, nil) {
		t.Fatal("a nil client has hooks")
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("file-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RC_TEST_CB_SECRET", "env-secret-0123456789")
	write := func(s string) string {
		p := filepath.Join(dir, fmt.Sprintf("cb%d.json", time.Now().UnixNano()))
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	apps, err := LoadFile(write(`{"apps": {
		"one": {"login_url": "https://one.example/login", "secret_file": "` + secretFile + `",
			"timeout": "250ms", "max_concurrent": 4, "login_policy": "fail-closed",
			"breaker": {"failures": 2, "open_for": "30s", "probes": 3}},
		"two": {"send_url": "http://two.example/send", "secret_env": "RC_TEST_CB_SECRET", "send_policy": "fail-open"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	one, two := apps["one"], apps["two"]
	if string(one.Secret) != "file-secret-0123456789" || one.Timeout != 250*time.Millisecond || one.MaxConcurrent != 4 ||
		one.LoginPolicy != FailClosed || one.Breaker.Failures != 2 || one.Breaker.OpenFor != 30*time.Second || one.Breaker.Probes != 3 {
		t.Fatalf("one = %+v", one)
	}
	if string(two.Secret) != "env-secret-0123456789" || two.SendURL != "http://two.example/send" || two.SendPolicy != FailOpen {
		t.Fatalf("two = %+v", two)
	}
	for _, tc := range []struct{ file, want string }{
		{`{"apps": {"x": {"login_url": "https://x/l", "secret_env": "RC_TEST_CB_SECRET", "timout": "1s"}}}`, "unknown field"},
		{`{"apps": {"x": {"login_url": "https://x/l"}}}`, "secret_file or secret_env is required"},
		{`{"apps": {"x": {"login_url": "https://x/l", "secret_env": "RC_TEST_CB_UNSET"}}}`, "is not set"},
		{`{"apps": {"x": {"login_url": "ftp://x/l", "secret_env": "RC_TEST_CB_SECRET"}}}`, "http://"},
		{`{"apps": {"x": {"secret_env": "RC_TEST_CB_SECRET"}}}`, "no login_url or send_url"},
		{`{"apps": {"x": {"login_url": "https://x/l", "secret_env": "RC_TEST_CB_SECRET", "login_policy": "maybe"}}}`, "fail-open or fail-closed"},
		{`{"apps": {"x": {"login_url": "https://x/l", "secret_env": "RC_TEST_CB_SECRET", "timeout": "soon"}}}`, "positive duration"},
	} {
		if _, err := LoadFile(write(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.file, err, tc.want)
		}
	}
	t.Setenv("RC_TEST_CB_SHORT", "short")
	if _, err := LoadFile(write(`{"apps": {"x": {"login_url": "https://x/l", "secret_env": "RC_TEST_CB_SHORT"}}}`)); err == nil || !strings.Contains(err.Error(), "16 bytes") {
		t.Errorf("short secret: %v", err)
	}
}

// TestSetApps: new hooks take the calls made after SetApps; a hook whose configuration did not
// change keeps its endpoint (and breaker); a configuration New would refuse changes nothing;
// an app left out is no longer called.
func TestSetApps(t *testing.T) {
	first, second := newBackend(t), newBackend(t)
	c := newClient(t, first, nil, nil)
	if d := login(t, c); !d.Allow || first.calls.Load() != 1 {
		t.Fatalf("before: %+v, %d calls", d, first.calls.Load())
	}
	sendBefore := (*c.endpoints.Load())[endpointKey{"a", HookSend}]
	apps := map[string]AppConfig{"a": {
		LoginURL: second.srv.URL + "/login", SendURL: first.srv.URL + "/send", Secret: secret,
		Timeout: 2 * time.Second,
	}}
	if err := c.SetApps(apps); err != nil {
		t.Fatal(err)
	}
	if d := login(t, c); !d.Allow || second.calls.Load() != 1 || first.calls.Load() != 1 {
		t.Fatalf("after: %+v, calls %d to the old hook and %d to the new", d, first.calls.Load(), second.calls.Load())
	}
	if (*c.endpoints.Load())[endpointKey{"a", HookSend}] != sendBefore {
		t.Error("the unchanged send hook got a new endpoint (and breaker)")
	}
	bad := map[string]AppConfig{"a": {LoginURL: first.srv.URL + "/login", Secret: []byte("short")}}
	if err := c.SetApps(bad); err == nil {
		t.Fatal("a 5-byte secret was taken")
	}
	if login(t, c); second.calls.Load() != 2 {
		t.Errorf("after a refused configuration the login went elsewhere: %d calls to the hook in force", second.calls.Load())
	}
	if err := c.SetApps(nil); err != nil {
		t.Fatal(err)
	}
	if c.Has("a", HookLogin) {
		t.Error("app a still has a login hook after SetApps without it")
	}
}
