package api

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/ratelimit"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	keys := auth.APIKeys{"k": {App: "app"}}
	if _, err := (Config{Keys: keys}).withDefaults(); err == nil {
		t.Error("a config without Bus was accepted")
	}
	if _, err := (Config{Bus: &nats.Conn{}}).withDefaults(); err == nil {
		t.Error("a config without Keys was accepted")
	}
	cfg, err := Config{Bus: &nats.Conn{}, Keys: keys}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 3*time.Second || cfg.Log == nil || cfg.KVReplicas != 1 || cfg.Limits != DefaultCallLimits() {
		t.Fatalf("defaults: Timeout %v, Log %v, KVReplicas %d, Limits %v; want 3s, a logger, 1, %v", cfg.Timeout, cfg.Log, cfg.KVReplicas, cfg.Limits, DefaultCallLimits())
	}
	cfg, err = Config{Bus: &nats.Conn{}, Keys: keys, Timeout: time.Second, KVReplicas: 3, Limits: CallLimits{PerKey: ratelimit.Unlimited}}.withDefaults()
	if err != nil || cfg.Timeout != time.Second || cfg.KVReplicas != 3 || !cfg.Limits.PerKey.Off() {
		t.Fatalf("set values: %+v %v, want them kept", cfg, err)
	}
}
