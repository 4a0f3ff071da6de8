package chatlink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// putSettings creates the room (if need be) and sets its delivery settings through the server
// API.
func putSettings(t *testing.T, c *devcluster.Cluster, room, settings string) {
	t.Helper()
	for _, call := range []struct{ method, path, body string }{
		{"POST", "/v1/rooms", `{"room":"` + room + `"}`},
		{"PATCH", "/v1/rooms/" + room, `{"settings":` + settings + `}`},
	} {
		req, _ := http.NewRequest(call.method, c.URL()+call.path, strings.NewReader(call.body))
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s %s: HTTP %d %s", call.method, call.path, call.body, resp.StatusCode, body)
		}
	}
}

// publisher sends room batches straight onto a room's broadcast subject, as the room service
// does, so a test controls exactly what reaches the ChatLinks and when.
type publisher struct {
	t   *testing.T
	nc  *nats.Conn
	seq int
}

func newPublisher(t *testing.T, c *devcluster.Cluster) *publisher {
	nc, err := bus.Connect(c.NATSURL(), "test publisher", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &publisher{t: t, nc: nc}
}

func (p *publisher) publish(room string, lane clientpb.Lane, body []byte) {
	p.t.Helper()
	p.seq++
	m := &clientpb.Message{Id: fmt.Sprintf("%026d", p.seq), Room: room, Lane: lane, Body: body, ServerTimeMs: time.Now().UnixMilli()}
	if err := bus.Publish(p.nc, bus.RoomSubject(devcluster.App, room), &buspb.RoomBatch{Messages: []*clientpb.Message{m}, SenderSessions: []string{""}}); err != nil {
		p.t.Fatal(err)
	}
}

// putSettingsSeen sets a room's delivery settings, as putSettings does, and returns once the
// room service's announcement of them has passed on the room's subject: every ChatLink,
// subscribed to it on the same NATS server, has it queued before anything p publishes
// afterwards.
func (p *publisher) putSettingsSeen(c *devcluster.Cluster, room, settings string, seen func(*roompb.RoomSettings) bool) {
	p.t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := p.nc.ChanSubscribe(bus.RoomSubject(devcluster.App, room), ch)
	if err != nil {
		p.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := p.nc.Flush(); err != nil {
		p.t.Fatal(err)
	}
	putSettings(p.t, c, room, settings)
	timeout := time.After(5 * time.Second)
	for {
		select {
		case m := <-ch:
			var b buspb.RoomBatch
			if proto.Unmarshal(m.Data, &b) == nil && b.Settings != nil && seen(b.Settings) {
				return
			}
		case <-timeout:
			p.t.Fatalf("room %s: settings %s not announced", room, settings)
		}
	}
}

func TestMergedAndUnmergedFanout(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	putSettings(t, c, "m", `{"flush_tick_ms":200,"normal_budget":-1,"critical_budget":-1}`)
	a := testkit.DialWS(t, c.Nodes[0].WSURL())
	a.Login(testcluster.Token(t, "a", "m"))
	b := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	b.Login(testcluster.Token(t, "b", "m"))
	p := newPublisher(t, c)

	// 20 messages within a tick arrive merged: far fewer frames than messages, in order.
	for i := 0; i < 20; i++ {
		p.publish("m", clientpb.Lane_LANE_NORMAL, []byte(fmt.Sprint(i)))
	}
	for _, cl := range []*testkit.Client{a, b} {
		msgs, frames := cl.CollectPushes(20)
		if frames > 2 {
			t.Fatalf("20 messages in one tick came in %d frames", frames)
		}
		for i, m := range msgs {
			if string(m.Body) != fmt.Sprint(i) {
				t.Fatalf("message %d is %q", i, m.Body)
			}
		}
	}

	// The room switched to unmerged: every message is its own frame, at once.
	p.putSettingsSeen(c, "m", `{"no_merge":true,"normal_budget":-1,"critical_budget":-1}`,
		func(s *roompb.RoomSettings) bool { return s.NoMerge })
	for i := 0; i < 5; i++ {
		p.publish("m", clientpb.Lane_LANE_NORMAL, []byte(fmt.Sprint(i)))
	}
	for _, cl := range []*testkit.Client{a, b} {
		if msgs, frames := cl.CollectPushes(5); frames != 5 || len(msgs) != 5 {
			t.Fatalf("unmerged: %d messages in %d frames, want 5 in 5", len(msgs), frames)
		}
	}
}

func TestBudgetThinsOnlyNormalAndBulk(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	putSettings(t, c, "busy", `{"flush_tick_ms":100,"normal_budget":10}`)
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Login(testcluster.Token(t, "viewer", "busy"))
	p := newPublisher(t, c)
	start := time.Now()
	for i := 0; i < 50; i++ {
		p.publish("busy", clientpb.Lane_LANE_NORMAL, []byte("chat"))
		p.publish("busy", clientpb.Lane_LANE_CRITICAL, []byte("gift"))
	}
	// Every normal message is delivered or counted as thinned, in the Push that follows. The
	// deadline is a bound for a loaded machine, not a figure.
	var critical, normal, thinned int
	deadline := time.After(10 * time.Second)
	for critical < 50 || normal+thinned < 50 {
		select {
		case f := <-cl.Frames():
			for _, m := range f.GetPush().GetMessages() {
				if m.Lane == clientpb.Lane_LANE_CRITICAL {
					critical++
				} else {
					normal++
				}
			}
			thinned += int(f.GetPush().GetThinned().GetNormal())
			if b := f.GetPush().GetThinned().GetBulk(); b != 0 {
				t.Fatalf("%d bulk messages thinned, none were sent", b)
			}
		case <-deadline:
			t.Fatalf("got %d of 50 critical messages; normal: %d delivered, %d counted as thinned", critical, normal, thinned)
		}
	}
	// At most half a second's budget in one burst, and the budget's refill over however long
	// the publishing and the delivery took (a loaded machine stretches them).
	allowed := 5 + int(10*time.Since(start).Seconds())
	if normal == 0 || normal > allowed || normal+thinned != 50 {
		t.Fatalf("a budget of 10/s: %d of 50 normal messages delivered (at most %d), %d counted as thinned", normal, allowed, thinned)
	}
}

// TestSlowReader: one member stops reading while others receive. The slow one is thinned, then
// gets critical only, then is closed; the others get everything, in order.
func TestSlowReader(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.ThinAtPendingBytes, cfg.ChatLink.CriticalOnlyAtPendingBytes, cfg.ChatLink.MaxPendingBytes = 32<<10, 128<<10, 512<<10
	})
	putSettings(t, c, "s", `{"flush_tick_ms":20,"normal_budget":-1,"critical_budget":-1}`)
	node := c.Nodes[0]

	// The slow member: logs in over TCP with a tiny receive buffer, and never reads.
	slow := testkit.DialTCP(t, node.TCPAddr(), testkit.ReceiveBuffer(4096), testkit.Paused())
	slow.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, "slow", "s")}}})

	var fast []*testkit.Client
	for i := 0; i < 10; i++ {
		cl := testkit.DialWS(t, node.WSURL())
		cl.Login(testcluster.Token(t, fmt.Sprint("fast", i), "s"))
		fast = append(fast, cl)
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if n := node.Connections(); n != 11 {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})

	p := newPublisher(t, c)
	body := bytes.Repeat([]byte("x"), 16<<10)
	sent := 0
	received := make([]int, len(fast))
	// Rounds of three critical and seven bulk messages: the fast readers keep up with each round
	// while the slow one's backlog grows (past what the sockets buffer) until it is closed.
	for round := 0; closeCount(t, c, node.Name(), "CLOSE_CODE_SLOW_READER") == 0; round++ {
		if round == 200 {
			t.Fatalf("the slow reader was not closed after %d messages", sent)
		}
		for i := 0; i < 10; i++ {
			lane := clientpb.Lane_LANE_BULK
			if i < 3 {
				lane = clientpb.Lane_LANE_CRITICAL
			}
			p.publish("s", lane, body)
			sent++
		}
		for i, cl := range fast {
			for received[i] < sent {
				msgs, _ := cl.CollectPushes(1)
				received[i] += len(msgs)
			}
		}
	}
	for i, n := range received {
		if n != sent {
			t.Fatalf("fast reader %d got %d of %d", i, n, sent)
		}
	}
	if drops := dropCount(t, c, "bulk", "slow_reader"); drops == 0 {
		t.Fatal("no bulk messages counted as dropped for the slow reader before it was closed")
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if n := node.Connections(); n != 10 {
			return fmt.Errorf("%d connections, want the 10 fast ones", n)
		}
		return nil
	})
}

func dropCount(t *testing.T, c *devcluster.Cluster, lane, reason string) int {
	t.Helper()
	return metricValue(t, c, `roomcast_chatlink_drops_total{lane="`+lane+`",node="cl-1",reason="`+reason+`"}`)
}

func TestHeartbeatIntervalGrowsAndFallsBack(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.HeartbeatInterval, cfg.ChatLink.HeartbeatStep, cfg.ChatLink.HeartbeatMax = 100*time.Millisecond, 20*time.Millisecond, 140*time.Millisecond
	}, withClock(clock))
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Login(testcluster.Token(t, "beat", "r"))
	beat := func() uint32 {
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{}}})
		for {
			if a := cl.Next().GetHeartbeatAck(); a != nil {
				return a.HeartbeatIntervalMs
			}
		}
	}
	var got []uint32
	for i := 0; i < 9; i++ {
		got = append(got, beat())
		clock.Add(30 * time.Millisecond)
	}
	want := []uint32{100, 100, 120, 120, 120, 140, 140, 140, 140}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("intervals %v, want %v", got, want)
	}
	clock.Add(250 * time.Millisecond) // a late beat: more than 1.5 intervals
	if iv := beat(); iv != 100 {
		t.Fatalf("after a late beat the interval is %d, want 100", iv)
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	n1 := c.Nodes[0]
	var clients []*testkit.Client
	for i := 0; i < 5; i++ {
		cl := testkit.DialWS(t, n1.WSURL())
		cl.Login(testcluster.Token(t, fmt.Sprint("d", i), "r"))
		clients = append(clients, cl)
	}
	// Ask over the bus, as `roomcast drain` does.
	nc, err := bus.Connect(c.NATSURL(), "operator", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var rep buspb.Reply
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := bus.Request(ctx, nc, bus.DrainSubject(n1.Name()), &buspb.DrainRequest{SpreadMs: 1000, DeadlineMs: 5000}, &rep); err != nil || rep.Code != 0 {
		t.Fatalf("drain request: %v %v", err, rep.String())
	}
	delays := map[uint32]bool{}
	for _, cl := range clients {
		r := cl.Next().GetReconnect()
		if r == nil || r.DelayMs >= 1000 {
			t.Fatalf("want Reconnect with a delay under 1s, got %v", r)
		}
		delays[r.DelayMs] = true
	}
	if len(delays) < 2 {
		t.Fatalf("all clients were told the same delay %v: no spread", delays)
	}
	// The dispatcher stops sending clients to the draining node, and it takes no logins.
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		ans, err := c.Dispatcher.Dispatch(dispatcher.Request{})
		if err != nil || len(ans.Nodes) != 1 || ans.Nodes[0].Node != "cl-2" {
			return fmt.Errorf("dispatch answers %+v, %v", ans, err)
		}
		return nil
	})
	late := testkit.DialTCP(t, n1.TCPAddr())
	late.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, "late", "r")}}})
	late.ExpectKick(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN)

	for _, cl := range clients { // the clients leave as told
		cl.Close()
	}
	select {
	case <-n1.Drained():
	case <-time.After(3 * time.Second):
		t.Fatal("node not drained 3s after its clients left")
	}
}

func TestNodeNameLease(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	nc, err := bus.Connect(c.NATSURL(), "second cl-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	twin, err := chatlink.New(chatlink.Config{Node: "cl-1", Bus: nc, Keys: map[string][]byte{"demo": []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	err = twin.Start()
	if !errors.Is(err, chatlink.ErrNameHeld) || !regexp.MustCompile(`the lease ends in \d+s`).MatchString(err.Error()) {
		t.Fatalf("a second node named cl-1 started: %v", err)
	}
	_ = twin.Shutdown(context.Background())
	// Once cl-1 stops, its name is free.
	if err := c.Nodes[0].Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	again, err := chatlink.New(chatlink.Config{Node: "cl-1", Bus: nc, Keys: map[string][]byte{"demo": []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Start(); err != nil {
		t.Fatalf("cl-1's name not free after it stopped: %v", err)
	}
	if err := again.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// apiSend sends a message through the server API and returns its id.
func apiSend(t *testing.T, c *devcluster.Cluster, room, body string) string {
	t.Helper()
	var out struct{ ID string }
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms/"+room+"/messages", devcluster.APIKey, body, &out); code != http.StatusOK {
		t.Fatalf("send %s: HTTP %d", body, code)
	}
	return out.ID
}

// TestRecoveryHonoursTags: a member that logs in asking for history gets the room's kept
// messages that its tags allow, and after a given id only the later ones.
func TestRecoveryHonoursTags(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	first := apiSend(t, c, "hist", `{"body":"for class 1","tag_expr":"\"class:1\" in tags"}`)
	apiSend(t, c, "hist", `{"body":"for class 2","tag_expr":"\"class:2\" in tags"}`)
	apiSend(t, c, "hist", `{"body":"bulk is not kept","lane":"bulk"}`)
	apiSend(t, c, "hist", `{"body":"for everyone","lane":"critical"}`)

	recover := func(uid string, login *clientpb.Login) []string {
		tok, err := c.Mint(uid, "hist", []string{"class:1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		login.Token = tok
		cl := testkit.DialWS(t, c.Nodes[0].WSURL())
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: login}})
		if cl.Next().GetLoginAck() == nil {
			t.Fatal("no LoginAck")
		}
		var bodies []string
		select {
		case f := <-cl.Frames():
			if !f.GetPush().GetHistory() || !f.GetPush().GetRecovery().GetRecovered() {
				t.Fatalf("want a complete history Push, got %v", f)
			}
			for _, m := range f.GetPush().Messages {
				bodies = append(bodies, string(m.Body))
			}
		case <-time.After(time.Second):
		}
		cl.Close()
		return bodies
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error { // history is written asynchronously
		if got := recover("a", &clientpb.Login{History: 10}); fmt.Sprint(got) != "[for class 1 for everyone]" {
			return fmt.Errorf("recovered %q", got)
		}
		return nil
	})
	if got := recover("b", &clientpb.Login{History: 1}); fmt.Sprint(got) != "[for everyone]" {
		t.Fatalf("the last message: %q", got)
	}
	if got := recover("c", &clientpb.Login{RecoverSince: first}); fmt.Sprint(got) != "[for everyone]" {
		t.Fatalf("since the first: %q", got)
	}
}

// TestPushFramesStayUnderTheLimit: a tick of large messages goes out as several Push frames,
// each within the protocol's 64 KiB frame limit, and in order.
func TestPushFramesStayUnderTheLimit(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	putSettings(t, c, "big", `{"flush_tick_ms":500,"normal_budget":-1,"critical_budget":-1}`)
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Login(testcluster.Token(t, "reader", "big"))
	p := newPublisher(t, c)
	const n = 10
	for i := range n {
		p.publish("big", clientpb.Lane_LANE_CRITICAL, append([]byte{byte(i)}, bytes.Repeat([]byte("x"), 16<<10-1)...))
	}
	var got []byte
	frames := 0
	for len(got) < n {
		f := cl.Next()
		if size := proto.Size(f); size > 65536 {
			t.Fatalf("a Push frame of %d bytes, over the 64 KiB limit", size)
		}
		frames++
		for _, m := range f.GetPush().GetMessages() {
			got = append(got, m.Body[0])
		}
	}
	if frames < 3 || !bytes.Equal(got, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("%d frames carrying messages %v; want at least 3 frames, in order", frames, got)
	}
}

// TestSendsBehindAFullSocket: a member stops reading (a small receive buffer, so its socket
// fills at once) while unmerged frames keep coming. The node's sends to it come back short or
// refused, the rest of each frame queues behind them, and once it reads again it gets every
// message whole and in order; a member beside it gets each message meanwhile. Both ways of
// writing are checked: batches through io_uring (the default) and a system call per frame.
func TestSendsBehindAFullSocket(t *testing.T) {
	t.Parallel()
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			t.Parallel()
			c := testcluster.Start(t, testcluster.ChatLinks(1), func(dc *devcluster.Config) {
				dc.ChatLink.PlainWrites = plain
				dc.ChatLink.MaxPendingBytes = 64 << 20 // the backlog may grow: this member is not to be closed
			})
			putSettings(t, c, "f", `{"no_merge":true,"normal_budget":-1,"critical_budget":-1}`)
			slow := testkit.DialTCP(t, c.Nodes[0].TCPAddr(), testkit.ReceiveBuffer(4096))
			slow.Login(testcluster.Token(t, "slow", "f"))
			other := testkit.DialWS(t, c.Nodes[0].WSURL())
			other.Login(testcluster.Token(t, "other", "f"))
			p := newPublisher(t, c)

			const count = 3000 // 3 MB: well past what the kernel's buffers hold
			body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 1000) }
			slow.Pause()
			for i := range count {
				p.publish("f", clientpb.Lane_LANE_CRITICAL, body(i))
				if m, _ := other.CollectPushes(1); !bytes.Equal(m[0].Body, body(i)) {
					t.Fatalf("other member: message %d is wrong", i)
				}
			}
			slow.Resume()
			msgs, _ := slow.CollectPushes(count)
			for i, m := range msgs {
				if !bytes.Equal(m.Body, body(i)) {
					t.Fatalf("slow member: message %d is %.10q..., want %.10q...", i, m.Body, body(i))
				}
			}
			// The way of writing under test is the one that wrote: a node without io_uring
			// would fall back to plain writes and this test would check them twice.
			ringSends := metricValue(t, c, `roomcast_chatlink_ring_sends_total{node="cl-1"}`)
			if plain != (ringSends == 0) {
				t.Fatalf("plain=%v, but %d frames went out in io_uring batches", plain, ringSends)
			}
		})
	}
}
