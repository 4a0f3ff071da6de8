package room

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/testutil"
)

func TestConfigWithDefaults(t *testing.T) {
	nc := new(nats.Conn) // never dialed: withDefaults only checks that there is one
	log := slog.New(slog.DiscardHandler)
	now := func() time.Time { return time.Unix(1, 0) }
	for _, tc := range []struct {
		name    string
		cfg     Config
		check   func(*testing.T, Config)
		wantErr string // a substring of the error; empty means none
	}{
		{"zero values take the defaults", Config{Bus: nc}, func(t *testing.T, c Config) {
			if c.Log == nil || c.Queue != "room" || c.Now == nil || c.LeaseTTL != 5*time.Second || c.KVReplicas != 1 {
				t.Errorf("defaults not filled: %+v", c)
			}
		}, ""},
		{"set values are kept", Config{Bus: nc, Log: log, Queue: "q", Now: now, LeaseTTL: time.Second, KVReplicas: 3, RequireCreated: true},
			func(t *testing.T, c Config) {
				if c.Log != log || c.Queue != "q" || c.Now() != now() || c.LeaseTTL != time.Second || c.KVReplicas != 3 || !c.RequireCreated {
					t.Errorf("set values changed: %+v", c)
				}
			}, ""},
		{"negative lease means the default", Config{Bus: nc, LeaseTTL: -time.Second}, func(t *testing.T, c Config) {
			if c.LeaseTTL != 5*time.Second {
				t.Errorf("LeaseTTL = %v, want 5s", c.LeaseTTL)
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
