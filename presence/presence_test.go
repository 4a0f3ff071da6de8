package presence_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/presence"
	"roomcast/proto/clientpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// login opens a TCP connection to addr and logs uid in on device.
func login(t *testing.T, addr, uid, device string) *testkit.Client {
	t.Helper()
	cl := testkit.DialTCP(t, addr)
	if f := cl.LoginAs(testcluster.Token(t, uid, "r1"), device); f.GetLoginAck() == nil {
		t.Fatalf("login answered with %v", f)
	}
	return cl
}

// TestDevicePolicyEventsWebhook checks the multi-device policy, the online/offline events on
// NATS, and the batched webhook, with two presence instances: each event is acted on once.
func TestDevicePolicyEventsWebhook(t *testing.T) {
	t.Parallel()
	hook, posted := webhook(t)

	// The ChatLinks stamp each login with their clock, and the policy replaces the oldest
	// sessions first: the test moves the clock on between logins.
	clock := testkit.NewClock(time.Now())
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.ChatLinks, cfg.ServiceInstances = 2, 2
		cfg.ChatLink.Now = clock.Now
		cfg.Presence = presence.Config{
			Policies:     map[string]presence.DevicePolicy{devcluster.App: {MaxSessions: 2, OnePerDevice: true}},
			Webhooks:     map[string]string{devcluster.App: hook.URL},
			WebhookEvery: 50 * time.Millisecond,
		}
	})

	events := make(chan *buspb.SessionEvents, 64)
	nc, err := bus.Connect(c.NATSURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.Subscribe(bus.AppEventsSubject(devcluster.App), func(m *nats.Msg) {
		var evs buspb.SessionEvents
		if proto.Unmarshal(m.Data, &evs) == nil {
			events <- &evs
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = nc.Flush()

	n1, n2 := c.Nodes[0].TCPAddr(), c.Nodes[1].TCPAddr()
	web1 := login(t, n1, "ann", "web")
	clock.Add(time.Second)
	ios := login(t, n2, "ann", "ios")
	// A second web session replaces the first, on the other node.
	clock.Add(time.Second)
	web2 := login(t, n2, "ann", "web")
	web1.ExpectKick(clientpb.CloseCode_CLOSE_CODE_REPLACED)
	// A third device would make three sessions: the oldest (ios) goes.
	clock.Add(time.Second)
	login(t, n1, "ann", "pc")
	ios.ExpectKick(clientpb.CloseCode_CLOSE_CODE_REPLACED)
	// The scenario: the newest web session stays. No event says a kick will not come, so it
	// watches for one for a while.
	web2.ExpectSilence(200 * time.Millisecond)

	// Events: 4 logins and 2 logouts, each published once across both instances.
	var logins, logouts int
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for {
			select {
			case evs := <-events:
				for _, ev := range evs.Events {
					if ev.Kind == buspb.SessionEvent_KIND_LOGIN {
						logins++
					} else {
						logouts++
					}
				}
				continue
			default:
			}
			break
		}
		if logins != 4 || logouts != 2 {
			return fmt.Errorf("events: %d logins, %d logouts; want 4 and 2", logins, logouts)
		}
		return nil
	})
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := posted(); len(got) != 6 {
			return fmt.Errorf("webhook got %d events, want 6: %v", len(got), got)
		}
		return nil
	})
}
