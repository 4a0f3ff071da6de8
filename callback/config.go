package callback

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Policy is what a call that got no answer decides (timeout, error, garbage, breaker open,
// pool full).
type Policy int

const (
	// FailOpen lets the login or the send through as if the app had allowed it unchanged.
	FailOpen Policy = iota
	// FailClosed refuses it: the client is told the app's check is unavailable (a transient
	// code: close 4504 for a login, error 503 for a send).
	FailClosed
)

// ParsePolicy parses "fail-open" or "fail-closed"; "" is FailOpen.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "", "fail-open":
		return FailOpen, nil
	case "fail-closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("policy %q: want fail-open or fail-closed", s)
}

func (p Policy) String() string {
	if p == FailClosed {
		return "fail-closed"
	}
	return "fail-open"
}

// AppConfig configures one app's callbacks.
type AppConfig struct {
	// LoginURL receives a POST for each login the room service admitted into one of the app's
	// rooms. Zero value means logins are not called back.
	LoginURL string
	// SendURL receives a POST for each message a member sends (not the app server's own
	// sends). Zero value means sends are not called back.
	SendURL string
	// Secret is the HMAC-SHA256 key that signs each request (sign.go). Required, at least 16
	// bytes.
	Secret []byte
	// Timeout bounds each call, from sending the request to reading the answer. Zero value
	// means 1s. Keep it below the ChatLinks' RequestTimeout (3s), which bounds the whole login
	// or send.
	Timeout time.Duration
	// MaxConcurrent bounds the calls in flight, per hook. Zero value means 16.
	MaxConcurrent int
	// MaxQueued bounds the calls waiting for a free slot, per hook; one more is decided by the
	// failure policy at once. Zero value means 64.
	MaxQueued int
	// MaxWait is how long a call may wait in the queue before it is decided by the failure
	// policy without being made. Zero value means Timeout.
	MaxWait time.Duration
	// LoginPolicy and SendPolicy decide the calls that got no answer. Zero values mean
	// FailOpen.
	LoginPolicy, SendPolicy Policy
	// Breaker configures each hook's circuit breaker.
	Breaker BreakerConfig
}

func (a AppConfig) withDefaults() (AppConfig, error) {
	if a.LoginURL == "" && a.SendURL == "" {
		return a, errors.New("no login_url or send_url")
	}
	for _, u := range []string{a.LoginURL, a.SendURL} {
		if u == "" {
			continue
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return a, fmt.Errorf("URL %q: want an absolute http:// or https:// URL", u)
		}
	}
	if len(a.Secret) < 16 {
		return a, errors.New("the secret must be at least 16 bytes")
	}
	if a.Timeout <= 0 {
		a.Timeout = time.Second
	}
	if a.MaxConcurrent <= 0 {
		a.MaxConcurrent = 16
	}
	if a.MaxQueued <= 0 {
		a.MaxQueued = 64
	}
	if a.MaxWait <= 0 {
		a.MaxWait = a.Timeout
	}
	a.Breaker = a.Breaker.withDefaults()
	return a, nil
}

func (a AppConfig) policy(h Hook) Policy {
	if h == HookLogin {
		return a.LoginPolicy
	}
	return a.SendPolicy
}

// fileApp is an app's entry in a callbacks file (docs/callbacks.md): durations as Go durations
// ("1s"), the secret from a file or an environment variable, never from the file itself.
type fileApp struct {
	LoginURL      string `json:"login_url"`
	SendURL       string `json:"send_url"`
	SecretFile    string `json:"secret_file"`
	SecretEnv     string `json:"secret_env"`
	Timeout       string `json:"timeout"`
	MaxConcurrent int    `json:"max_concurrent"`
	MaxQueued     int    `json:"max_queued"`
	MaxWait       string `json:"max_wait"`
	LoginPolicy   string `json:"login_policy"`
	SendPolicy    string `json:"send_policy"`
	Breaker       struct {
		Failures    int     `json:"failures"`
		FailureRate float64 `json:"failure_rate"`
		Window      int     `json:"window"`
		OpenFor     string  `json:"open_for"`
		Probes      int     `json:"probes"`
	} `json:"breaker"`
}

// LoadFile reads a callbacks file: {"apps": {"APP": {...}}} (docs/callbacks.md). Unknown
// fields are errors, so that a misspelt setting is not silently ignored.
func LoadFile(path string) (map[string]AppConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("callback: %w", err)
	}
	var f struct {
		Apps map[string]fileApp `json:"apps"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("callback: %s: %w", path, err)
	}
	apps := make(map[string]AppConfig, len(f.Apps))
	for name, fa := range f.Apps {
		a, err := fa.config()
		if err != nil {
			return nil, fmt.Errorf("callback: %s: app %q: %w", path, name, err)
		}
		if _, err := a.withDefaults(); err != nil {
			return nil, fmt.Errorf("callback: %s: app %q: %w", path, name, err)
		}
		apps[name] = a
	}
	return apps, nil
}

func (fa fileApp) config() (AppConfig, error) {
	a := AppConfig{
		LoginURL: fa.LoginURL, SendURL: fa.SendURL,
		MaxConcurrent: fa.MaxConcurrent, MaxQueued: fa.MaxQueued,
		Breaker: BreakerConfig{Failures: fa.Breaker.Failures, FailureRate: fa.Breaker.FailureRate, Window: fa.Breaker.Window, Probes: fa.Breaker.Probes},
	}
	var err error
	for _, d := range []struct {
		name string
		src  string
		into *time.Duration
	}{{"timeout", fa.Timeout, &a.Timeout}, {"max_wait", fa.MaxWait, &a.MaxWait}, {"breaker.open_for", fa.Breaker.OpenFor, &a.Breaker.OpenFor}} {
		if d.src == "" {
			continue
		}
		if *d.into, err = time.ParseDuration(d.src); err != nil || *d.into <= 0 {
			return a, fmt.Errorf("%s %q: want a positive duration such as 1s or 500ms", d.name, d.src)
		}
	}
	if a.LoginPolicy, err = ParsePolicy(fa.LoginPolicy); err != nil {
		return a, fmt.Errorf("login_policy: %w", err)
	}
	if a.SendPolicy, err = ParsePolicy(fa.SendPolicy); err != nil {
		return a, fmt.Errorf("send_policy: %w", err)
	}
	switch {
	case fa.SecretFile != "" && fa.SecretEnv != "":
		return a, errors.New("give secret_file or secret_env, not both")
	case fa.SecretFile != "":
		b, err := os.ReadFile(fa.SecretFile)
		if err != nil {
			return a, fmt.Errorf("secret_file: %w", err)
		}
		a.Secret = []byte(strings.TrimSpace(string(b)))
	case fa.SecretEnv != "":
		v, ok := os.LookupEnv(fa.SecretEnv)
		if !ok {
			return a, fmt.Errorf("secret_env: %s is not set", fa.SecretEnv)
		}
		a.Secret = []byte(strings.TrimSpace(v))
	default:
		return a, errors.New("secret_file or secret_env is required")
	}
	return a, nil
}
