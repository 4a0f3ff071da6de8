package presence

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/testutil"
)

func TestConfigWithDefaults(t *testing.T) {
	nc := new(nats.Conn) // never dialed: withDefaults only checks that there is one
	log := slog.New(slog.DiscardHandler)
	hc := &http.Client{}
	for _, tc := range []struct {
		name    string
		cfg     Config
		check   func(*testing.T, Config)
		wantErr string // a substring of the error; empty means none
	}{
		{"zero values take the defaults", Config{Bus: nc}, func(t *testing.T, c Config) {
			if c.Log == nil || c.Queue != "presence" || c.LeaseTTL != 5*time.Second || c.WebhookEvery != time.Second {
				t.Errorf("defaults not filled: %+v", c)
			}
			if c.HTTPClient == nil || c.HTTPClient.Timeout != 5*time.Second {
				t.Errorf("HTTPClient = %+v, want one with a 5s timeout", c.HTTPClient)
			}
		}, ""},
		{"set values are kept", Config{Bus: nc, Log: log, Queue: "q", LeaseTTL: time.Second, WebhookEvery: 2 * time.Second, HTTPClient: hc},
			func(t *testing.T, c Config) {
				if c.Log != log || c.Queue != "q" || c.LeaseTTL != time.Second || c.WebhookEvery != 2*time.Second || c.HTTPClient != hc {
					t.Errorf("set values changed: %+v", c)
				}
			}, ""},
		{"negative durations mean the defaults", Config{Bus: nc, LeaseTTL: -1, WebhookEvery: -1}, func(t *testing.T, c Config) {
			if c.LeaseTTL != 5*time.Second || c.WebhookEvery != time.Second {
				t.Errorf("LeaseTTL %v, WebhookEvery %v; want 5s and 1s", c.LeaseTTL, c.WebhookEvery)
			}
		}, ""},
		{"no bus", Config{}, nil, "Bus is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.withDefaults()
			testutil.WantError(t, err, tc.wantErr)
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}
