package probe

import (
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func TestConfigWithDefaults(t *testing.T) {
	const dispatcher = "http://127.0.0.1:8080"
	secret := []byte("s")
	testkit.RunConfigCases(t, Config.withDefaults, []testkit.ConfigCase[Config]{
		{Name: "zero values take the defaults", Config: Config{Dispatcher: dispatcher, Secret: secret}, Check: func(t *testing.T, c Config) {
			if c.App != "demo" || c.Room != "r1" || c.Clients != 4 || c.Messages != 10 || c.Transport != sdk.TransportWebSocket ||
				c.Lane != clientpb.Lane_LANE_CRITICAL || c.Timeout != 15*time.Second || c.Settle != 200*time.Millisecond {
				t.Errorf("defaults not filled: %+v", c)
			}
		}},
		{Name: "no dispatcher", Config: Config{Secret: secret}, WantErr: "no dispatcher URL"},
		{Name: "no secret", Config: Config{Dispatcher: dispatcher}, WantErr: "no secret"},
		{Name: "one client", Config: Config{Dispatcher: dispatcher, Secret: secret, Clients: 1}, WantErr: "at least 2 clients"},
		{Name: "negative messages", Config: Config{Dispatcher: dispatcher, Secret: secret, Messages: -1}, WantErr: "at least 1 message"},
		{Name: "bad transport", Config: Config{Dispatcher: dispatcher, Secret: secret, Transport: "udp"}, WantErr: `unknown transport "udp"`},
	})
}
