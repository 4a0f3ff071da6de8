package presence_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/devcluster"
	"roomcast/internal/testutil"
	"roomcast/presence"
	pb "roomcast/proto/roomcastpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkFor polls f until it returns nil or the time is up.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	testutil.CheckFor(t, total, every, f)
}

// login opens a TCP connection to addr, logs uid in on device and returns the connection's
// frames (the channel closes when the connection ends).
func login(t *testing.T, c *devcluster.Cluster, addr, uid, device string) <-chan *pb.Frame {
	t.Helper()
	tok, err := c.Mint(uid, "r1", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	frames := make(chan *pb.Frame, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(frames)
		br := bufio.NewReader(nc)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, b); err != nil {
				return
			}
			var f pb.Frame
			if proto.Unmarshal(b, &f) == nil {
				frames <- &f
			}
		}
	}()
	t.Cleanup(func() { _ = nc.Close(); <-done })
	b, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Login{Login: &pb.Login{Token: tok, Device: device}}})
	if _, err := nc.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-frames:
		if f.GetLoginAck() == nil {
			t.Fatalf("login answered with %v", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no LoginAck")
	}
	return frames
}

func expectKick(t *testing.T, frames <-chan *pb.Frame, code pb.CloseCode) {
	t.Helper()
	select {
	case f := <-frames:
		if f.GetKick().GetCode() != uint32(code) {
			t.Fatalf("want Kick %v, got %v", code, f)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no Kick %v in 5s", code)
	}
}

// TestDevicePolicyEventsWebhook checks the multi-device policy, the online/offline events on
// NATS, and the batched webhook, with two presence instances: each event is acted on once.
func TestDevicePolicyEventsWebhook(t *testing.T) {
	var mu sync.Mutex
	var posted []presence.WebhookEvent
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b presence.WebhookBatch
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.App != devcluster.App {
			t.Errorf("webhook got %v %v", b, err)
		}
		mu.Lock()
		posted = append(posted, b.Events...)
		mu.Unlock()
	}))
	defer hook.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Config{
		DataDir: t.TempDir(), ChatLinks: 2, ServiceInstances: 2, LeaseInterval: 100 * time.Millisecond,
		Presence: presence.Config{
			Policies:     map[string]presence.DevicePolicy{devcluster.App: {MaxSessions: 2, OnePerDevice: true}},
			Webhooks:     map[string]string{devcluster.App: hook.URL},
			WebhookEvery: 50 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	events := make(chan *pb.SessionEvents, 64)
	nc, err := bus.Connect(c.NATSURL(), "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.Subscribe(bus.AppEventsSubject(devcluster.App), func(m *nats.Msg) {
		var evs pb.SessionEvents
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
	web1 := login(t, c, n1, "ann", "web")
	time.Sleep(5 * time.Millisecond) // a later login time
	ios := login(t, c, n2, "ann", "ios")
	// A second web session replaces the first, on the other node.
	time.Sleep(5 * time.Millisecond)
	web2 := login(t, c, n2, "ann", "web")
	expectKick(t, web1, pb.CloseCode_CLOSE_CODE_REPLACED)
	// A third device would make three sessions: the oldest (ios) goes.
	time.Sleep(5 * time.Millisecond)
	login(t, c, n1, "ann", "pc")
	expectKick(t, ios, pb.CloseCode_CLOSE_CODE_REPLACED)
	select {
	case f := <-web2:
		t.Fatalf("the newest web session got %v", f)
	case <-time.After(200 * time.Millisecond):
	}

	// Events: 4 logins and 2 logouts, each published once across both instances.
	var logins, logouts int
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for {
			select {
			case evs := <-events:
				for _, ev := range evs.Events {
					if ev.Kind == pb.SessionEvent_KIND_LOGIN {
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
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(posted) != 6 {
			return fmt.Errorf("webhook got %d events, want 6: %v", len(posted), posted)
		}
		return nil
	})
}
