package chatlink

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/ratelimit"
)

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	valid := Config{Node: "n1", Bus: new(nats.Conn), Keys: auth.Keyring{"app": []byte("k")}}
	for name, tc := range map[string]struct {
		edit func(*Config)
		err  string
	}{
		"bad name":                        {func(c *Config) { c.Node = "a b" }, "node name"},
		"no bus":                          {func(c *Config) { c.Bus = nil }, "Bus is required"},
		"no keys":                         {func(c *Config) { c.Keys = nil }, "Keys needs"},
		"lifetime of an unknown app":      {func(c *Config) { c.MaxTokenLifetime = auth.Lifetimes{"other": time.Hour} }, "MaxTokenLifetime"},
		"negative lifetime":               {func(c *Config) { c.MaxTokenLifetime = auth.Lifetimes{"app": -time.Hour} }, "MaxTokenLifetime"},
		"negative latency budget":         {func(c *Config) { c.LatencyBudget = -time.Second }, "latency budget"},
		"public URL not a WebSocket URL":  {func(c *Config) { c.PublicWSURL = "https://edge.example.com/v1/ws" }, "public WebSocket URL"},
		"public URL without a host":       {func(c *Config) { c.PublicWSURL = "wss:///v1/ws" }, "public WebSocket URL"},
		"public TCP address without port": {func(c *Config) { c.PublicTCPAddr = "edge.example.com" }, "public TCP address"},
	} {
		cfg := valid
		tc.edit(&cfg)
		if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error about %q", name, err, tc.err)
		}
	}

	cfg, err := valid.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HeartbeatInterval != 25*time.Second || cfg.HeartbeatMax != 60*time.Second || cfg.HeartbeatStep != 5*time.Second ||
		cfg.LoginTimeout != 10*time.Second || cfg.FlushTick != 100*time.Millisecond || cfg.MaxPendingBytes != 1<<20 ||
		cfg.WSListen != "127.0.0.1:0" || cfg.MaxConnections <= 0 || cfg.Log == nil || cfg.Now == nil {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
	if valid.Now != nil || valid.HeartbeatInterval != 0 {
		t.Fatal("withDefaults changed the config it was called on")
	}

	set := valid
	set.HeartbeatInterval, set.LoginTimeout = 10*time.Second, time.Second
	set.Now = func() time.Time { return time.Unix(1, 0) }
	if cfg, _ = set.withDefaults(); cfg.HeartbeatInterval != 10*time.Second || cfg.HeartbeatMax != 24*time.Second ||
		cfg.LoginTimeout != time.Second || !cfg.Now().Equal(time.Unix(1, 0)) {
		t.Fatalf("set fields not kept: %+v", cfg)
	}
}

// TestZeroLimitsAreTheDefaults: a Config that sets no limit gets DefaultLimits; a limit set
// stays, and ratelimit.Unlimited or a negative count stays off.
func TestZeroLimitsAreTheDefaults(t *testing.T) {
	t.Parallel()
	valid := Config{Node: "n1", Bus: new(nats.Conn), Keys: auth.Keyring{"app": []byte("k")}}
	got, err := valid.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Limits != DefaultLimits() {
		t.Fatalf("limits of a Config that sets none: %+v, want DefaultLimits %+v", got.Limits, DefaultLimits())
	}
	set := valid
	set.Limits = Limits{SendsPerConn: ratelimit.Limit{Rate: 1, Burst: 1}, LoginsPerIP: ratelimit.Unlimited, ConnectionsPerIP: -1, LoginConcurrency: -1}
	if got, err = set.withDefaults(); err != nil {
		t.Fatal(err)
	}
	want := DefaultLimits()
	want.SendsPerConn, want.LoginsPerIP, want.ConnectionsPerIP, want.LoginConcurrency = set.Limits.SendsPerConn, ratelimit.Unlimited, -1, -1
	if got.Limits != want {
		t.Fatalf("limits %+v, want %+v", got.Limits, want)
	}
	if !got.Limits.LoginsPerIP.Off() {
		t.Fatal("ratelimit.Unlimited limits")
	}
}
