package probe

import (
	"testing"
	"time"

	"roomcast/internal/testutil"
	"roomcast/proto/roomcastpb"
	"roomcast/sdk"
)

func TestConfigWithDefaults(t *testing.T) {
	target := Config{Dispatcher: "http://127.0.0.1:8080", Secret: []byte("s")}
	with := func(edit func(*Config)) Config {
		c := target
		edit(&c)
		return c
	}
	testutil.RunConfigCases(t, Config.withDefaults, []testutil.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: target, Check: func(t *testing.T, c Config) {
			if c.App != "demo" || c.Room != "r1" || c.Clients != 4 || c.Messages != 10 || c.Transport != sdk.TransportWebSocket ||
				c.Lane != roomcastpb.Lane_LANE_CRITICAL || c.Timeout != 15*time.Second || c.Settle != 200*time.Millisecond {
				t.Errorf("defaults not filled: %+v", c)
			}
		}},
		{Name: "no dispatcher", Config: with(func(c *Config) { c.Dispatcher = "" }), WantErr: "no dispatcher URL"},
		{Name: "no secret", Config: with(func(c *Config) { c.Secret = nil }), WantErr: "no secret"},
		{Name: "one client", Config: with(func(c *Config) { c.Clients = 1 }), WantErr: "at least 2 clients"},
		{Name: "negative messages", Config: with(func(c *Config) { c.Messages = -1 }), WantErr: "at least 1 message"},
		{Name: "bad transport", Config: with(func(c *Config) { c.Transport = "udp" }), WantErr: `unknown transport "udp"`},
	})
}
