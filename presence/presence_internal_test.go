package presence

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/testkit"
)

func TestConfigWithDefaults(t *testing.T) {
	nc := new(nats.Conn) // never dialed: withDefaults only checks that there is one
	log := slog.New(slog.DiscardHandler)
	hc := &http.Client{}
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: Config{Bus: nc}, Check: func(t *testing.T, c Config) {
			if c.Log == nil || c.Queue != "presence" || c.LeaseTTL != 5*time.Second || c.WebhookEvery != time.Second {
				t.Errorf("defaults not filled: %+v", c)
			}
			if c.HTTPClient == nil || c.HTTPClient.Timeout != 5*time.Second {
				t.Errorf("HTTPClient = %+v, want one with a 5s timeout", c.HTTPClient)
			}
		}},
		{Name: "set values are kept", Config: Config{Bus: nc, Log: log, Queue: "q", LeaseTTL: time.Second, WebhookEvery: 2 * time.Second, HTTPClient: hc},
			Check: func(t *testing.T, c Config) {
				if c.Log != log || c.Queue != "q" || c.LeaseTTL != time.Second || c.WebhookEvery != 2*time.Second || c.HTTPClient != hc {
					t.Errorf("set values changed: %+v", c)
				}
			}},
		{Name: "negative durations mean the defaults", Config: Config{Bus: nc, LeaseTTL: -1, WebhookEvery: -1}, Check: func(t *testing.T, c Config) {
			if c.LeaseTTL != 5*time.Second || c.WebhookEvery != time.Second {
				t.Errorf("LeaseTTL %v, WebhookEvery %v; want 5s and 1s", c.LeaseTTL, c.WebhookEvery)
			}
		}},
		{Name: "no bus", Config: Config{}, WantErr: "Bus is required"},
	})
}
