package chatlink_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	pb "roomcast/proto/roomcastpb"
)

// TestHostileClients is the skeleton of the hostile-client suite (docs/security.md): members of a
// room chat, first quietly, then while attackers on loopback open handshakes they never finish
// (slow-loris), flood frames, send oversize and garbage frames, guess tokens, flood the room with
// joins and flood the server API with a valid key. Nothing the members send is lost in either
// phase, and the attacks show in the node's metrics. The members' p99 latency in each phase is
// logged, not checked: a timed figure on a shared machine belongs in a benchmark.
func TestHostileClients(t *testing.T) {
	t.Parallel()
	members, perMember, interval := 20, 10, 50*time.Millisecond
	if !testing.Short() {
		members, perMember = 1000, 20
	}
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]
	room := "hostile"
	// The members chat faster than a room's default budget (20 a second each member receives):
	// unlimited, so that any message missing is lost, not sampled.
	req, _ := http.NewRequest(http.MethodPost, c.URL()+"/v1/rooms", strings.NewReader(`{"room":"`+room+`","settings":{"normal_budget":-1}}`))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create the room: %s", resp.Status)
	}
	var cls []*testkit.Client
	for i := range members {
		cl := testkit.DialTCP(t, node.TCPAddr())
		cl.Login(testcluster.Token(t, "m"+strconv.Itoa(i), room))
		cls = append(cls, cl)
	}

	before := map[string]int{}
	watched := []string{
		`roomcast_chatlink_closes_total{code="CLOSE_CODE_BAD_TOKEN",node="` + node.Name() + `"}`,
		`roomcast_chatlink_closes_total{code="CLOSE_CODE_BAD_FRAME",node="` + node.Name() + `"}`,
		`roomcast_chatlink_closes_total{code="CLOSE_CODE_FRAME_TOO_LARGE",node="` + node.Name() + `"}`,
	}
	for _, s := range watched {
		before[s] = metricValue(t, c, s)
	}

	quiet := chatPhase(t, cls, "quiet", perMember, interval)

	ctx, cancel := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	for _, attack := range []func(context.Context){
		func(ctx context.Context) { slowLoris(ctx, node.WSURL()) },
		func(ctx context.Context) { frameFlood(ctx, c) },
		func(ctx context.Context) { garbageFrames(ctx, node.TCPAddr()) },
		func(ctx context.Context) { tokenGuesses(ctx, node.TCPAddr()) },
		func(ctx context.Context) { joinFlood(ctx, c, room) },
		func(ctx context.Context) { apiFlood(ctx, c, room) },
	} {
		attackers.Go(func() { attack(ctx) })
	}
	attacked := chatPhase(t, cls, "attacked", perMember, interval)
	cancel()
	attackers.Wait()

	t.Logf("%d members, %d messages each per phase: p99 quiet %v, under attack %v", members, perMember, quiet, attacked)
	for _, s := range watched {
		if after := metricValue(t, c, s); after <= before[s] {
			t.Errorf("%s: %d before the attacks, %d after: the attack does not show", s, before[s], after)
		}
	}
}

// chatPhase has every member send perMember messages, one per interval, and waits until every
// member has every other member's: it fails the test if one is lost. It returns the p99 of the
// time from a send to its receipt.
func chatPhase(t *testing.T, cls []*testkit.Client, phase string, perMember int, interval time.Duration) time.Duration {
	t.Helper()
	var senders sync.WaitGroup
	for i, cl := range cls {
		senders.Go(func() {
			for j := range perMember {
				body := fmt.Sprintf("%s/%d/%d/%d", phase, i, j, time.Now().UnixNano())
				cl.Send(&pb.Frame{Kind: &pb.Frame_Send{Send: &pb.Send{Seq: uint64(j + 1), Type: "chat", Lane: pb.Lane_LANE_NORMAL, Body: []byte(body)}}})
				time.Sleep(interval)
			}
		})
	}
	want := (len(cls) - 1) * perMember
	latencies := make([][]time.Duration, len(cls))
	var receivers sync.WaitGroup
	for i, cl := range cls {
		receivers.Go(func() {
			got := 0
			deadline := time.After(time.Duration(perMember)*interval + 20*time.Second)
			for got < want {
				select {
				case f := <-cl.Frames():
					for _, m := range f.GetPush().GetMessages() {
						parts := strings.Split(string(m.Body), "/")
						if len(parts) != 4 || parts[0] != phase || parts[1] == strconv.Itoa(i) {
							continue
						}
						ns, _ := strconv.ParseInt(parts[3], 10, 64)
						latencies[i] = append(latencies[i], time.Since(time.Unix(0, ns)))
						got++
					}
					if th := f.GetPush().GetThinned(); th != nil {
						t.Errorf("%s: member %d's stream was thinned: %v", phase, i, th)
						return
					}
				case <-cl.Done():
					t.Errorf("%s: member %d was disconnected after %d of %d messages", phase, i, got, want)
					return
				case <-deadline:
					t.Errorf("%s: member %d received %d of %d messages", phase, i, got, want)
					return
				}
			}
		})
	}
	senders.Wait()
	receivers.Wait()
	all := slices.Concat(latencies...)
	if len(all) == 0 {
		return 0
	}
	slices.Sort(all)
	return all[len(all)*99/100]
}

// slowLoris holds connections that send their upgrade request a byte at a time.
func slowLoris(ctx context.Context, wsURL string) {
	addr := strings.TrimPrefix(strings.TrimSuffix(wsURL, "/v1/ws"), "ws://")
	req := "GET /v1/ws HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\n"
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		if len(conns) < 50 {
			if c, err := net.Dial("tcp", addr); err == nil {
				conns = append(conns, c)
			}
		}
		for _, c := range conns {
			_, _ = c.Write([]byte{req[i%len(req)]})
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// frameFlood logs in and sends heartbeats as fast as the connection takes them, reconnecting
// when it is closed.
func frameFlood(ctx context.Context, c *devcluster.Cluster) {
	hb, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	var burst []byte
	for range 100 {
		burst = append(burst, testkit.TCPFrame(hb)...)
	}
	for ctx.Err() == nil {
		nc := loggedIn(c, "flooder", "elsewhere")
		if nc == nil {
			return
		}
		go drain(nc)
		for ctx.Err() == nil {
			if _, err := nc.Write(burst); err != nil {
				break
			}
		}
		_ = nc.Close()
	}
}

// garbageFrames connects again and again and sends a frame that does not parse, or announces
// one over the size limit.
func garbageFrames(ctx context.Context, addr string) {
	garbage := make([]byte, 64)
	for i := 0; ctx.Err() == nil; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue
		}
		_, _ = rand.Read(garbage)
		if i%2 == 0 {
			_, _ = c.Write(testkit.TCPFrame(append([]byte{0xff, 0xff, 0xff}, garbage...)))
		} else {
			_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
		}
		drain(c)
	}
}

// tokenGuesses logs in with made-up tokens.
func tokenGuesses(ctx context.Context, addr string) {
	for ctx.Err() == nil {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue
		}
		b, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Login{Login: &pb.Login{Token: "eyJhbGciOiJIUzI1NiJ9.eyJhcHAiOiJkZW1vIn0." + rand.Text()}}})
		_, _ = c.Write(testkit.TCPFrame(b))
		drain(c)
	}
}

// joinFlood logs new users into the members' room and leaves at once.
func joinFlood(ctx context.Context, c *devcluster.Cluster, room string) {
	for i := 0; ctx.Err() == nil; i++ {
		if nc := loggedIn(c, "joiner"+strconv.Itoa(i), room); nc != nil {
			_ = nc.Close()
		}
	}
}

// apiFlood calls the server API with a valid key as fast as it answers.
func apiFlood(ctx context.Context, c *devcluster.Cluster, room string) {
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+"/v1/rooms/"+room+"/members", nil)
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = resp.Body.Read(make([]byte, 4096))
			resp.Body.Close()
		}
	}
}

// loggedIn dials the node over TCP and logs uid into room, returning nil if it cannot.
func loggedIn(c *devcluster.Cluster, uid, room string) net.Conn {
	tok, err := c.Mint(uid, room, nil, time.Hour)
	if err != nil {
		return nil
	}
	nc, err := net.Dial("tcp", c.Nodes[0].TCPAddr())
	if err != nil {
		return nil
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := testkit.WriteFrame(nc, &pb.Frame{Kind: &pb.Frame_Login{Login: &pb.Login{Token: tok}}}); err != nil {
		_ = nc.Close()
		return nil
	}
	f, err := testkit.ReadFrame(nc)
	_ = nc.SetDeadline(time.Time{})
	if err != nil || f.GetLoginAck() == nil {
		_ = nc.Close()
		return nil
	}
	return nc
}

// drain reads c until the node closes it, bounded by a deadline.
func drain(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			_ = c.Close()
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
