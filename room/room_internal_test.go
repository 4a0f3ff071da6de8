package room

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/testkit"
)

func TestConfigWithDefaults(t *testing.T) {
	nc := new(nats.Conn) // never dialed: withDefaults only checks that there is one
	log := slog.New(slog.DiscardHandler)
	now := func() time.Time { return time.Unix(1, 0) }
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: Config{Bus: nc}, Check: func(t *testing.T, c Config) {
			if c.Log == nil || c.Queue != "room" || c.Now == nil || c.LeaseTTL != 5*time.Second || c.KVReplicas != 1 {
				t.Errorf("defaults not filled: %+v", c)
			}
		}},
		{Name: "set values are kept", Config: Config{Bus: nc, Log: log, Queue: "q", Now: now, LeaseTTL: time.Second, KVReplicas: 3, RequireCreated: true},
			Check: func(t *testing.T, c Config) {
				if c.Log != log || c.Queue != "q" || c.Now() != now() || c.LeaseTTL != time.Second || c.KVReplicas != 3 || !c.RequireCreated {
					t.Errorf("set values changed: %+v", c)
				}
			}},
		{Name: "negative lease means the default", Config: Config{Bus: nc, LeaseTTL: -time.Second}, Check: func(t *testing.T, c Config) {
			if c.LeaseTTL != 5*time.Second {
				t.Errorf("LeaseTTL = %v, want 5s", c.LeaseTTL)
			}
		}},
		{Name: "no bus", Config: Config{}, WantErr: "Bus is required"},
	})
}
