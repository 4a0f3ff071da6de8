package cdnmanager_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"roomcast/cdnpusher"
	"roomcast/internal/bus"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startCluster starts a dev cluster with one ChatLink and a quick CDN manager.
func startCluster(t *testing.T, mutate ...testcluster.Option) *devcluster.Cluster {
	return testcluster.Start(t, append([]testcluster.Option{func(c *devcluster.Config) {
		c.ChatLinks = 1
		c.CDN.Tick = 50 * time.Millisecond
	}}, mutate...)...)
}

// member is a client on the TCP transport that keeps every frame it gets.
type member struct {
	t      *testing.T
	conn   net.Conn
	frames chan *clientpb.Frame
	ack    *clientpb.LoginAck
}

func join(t *testing.T, c *devcluster.Cluster, uid, room string, tags ...string) *member {
	t.Helper()
	tok, err := c.Mint(uid, room, tags, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", c.Nodes[0].TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	m := &member{t: t, conn: conn, frames: make(chan *clientpb.Frame, 100_000)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(m.frames)
		r := bufio.NewReader(conn)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(r, b); err != nil {
				return
			}
			f := &clientpb.Frame{}
			if proto.Unmarshal(b, f) == nil {
				m.frames <- f
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	m.write(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: tok}}})
	f := m.next(5 * time.Second)
	if f.GetLoginAck() == nil {
		t.Fatalf("%s: want a LoginAck, got %v", uid, f)
	}
	m.ack = f.GetLoginAck()
	return m
}

func (m *member) write(f *clientpb.Frame) {
	b, _ := proto.Marshal(f)
	buf := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	if _, err := m.conn.Write(append(buf, b...)); err != nil {
		m.t.Fatal(err)
	}
}

// next returns the next frame, failing the test when none comes within d.
func (m *member) next(d time.Duration) *clientpb.Frame {
	m.t.Helper()
	select {
	case f, ok := <-m.frames:
		if !ok {
			m.t.Fatal("connection closed")
		}
		return f
	case <-time.After(d):
		m.t.Fatalf("no frame in %v", d)
		return nil
	}
}

// cdnConfig waits for a CdnConfig frame, keeping the pushed messages met on the way in got.
func (m *member) cdnConfig(d time.Duration, got map[string]*clientpb.Message) *clientpb.CdnConfig {
	m.t.Helper()
	deadline := time.Now().Add(d)
	for {
		f := m.next(time.Until(deadline))
		if c := f.GetCdnConfig(); c != nil {
			return c
		}
		for _, msg := range f.GetPush().GetMessages() {
			got[msg.Id] = msg
		}
	}
}

// pushed collects the messages pushed to m for d.
func (m *member) pushed(d time.Duration, got map[string]*clientpb.Message) {
	timeout := time.After(d)
	for {
		select {
		case f, ok := <-m.frames:
			if !ok {
				return
			}
			for _, msg := range f.GetPush().GetMessages() {
				got[msg.Id] = msg
			}
		case <-timeout:
			return
		}
	}
}

// api calls the server API over HTTP and decodes the answer into out (when not nil).
func api(t testing.TB, c *devcluster.Cluster, method, path string, body any, out any) {
	t.Helper()
	if err := apiCall(c, method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

// apiCall is api for goroutines other than the test's: it returns the error.
func apiCall(c *devcluster.Cluster, method, path string, body any, out any) error {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, c.URL()+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d %s", method, path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return nil
}

// sent is SendToRoom's answer.
type sent struct {
	ID           string `json:"id"`
	ServerTimeMs int64  `json:"server_time_ms"`
}

// send sends a message to a room through the server API and returns its id and time.
func send(t testing.TB, c *devcluster.Cluster, room, lane, body, tagExpr string) (string, int64) {
	t.Helper()
	var out sent
	api(t, c, "POST", "/v1/rooms/"+room+"/messages", map[string]string{"lane": lane, "body": body, "tag_expr": tagExpr}, &out)
	return out.ID, out.ServerTimeMs
}

// gathered sums the series of a metric family in reg.
func gathered(t testing.TB, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// roomCdn is GetRoomCdn's answer, the fields the tests read.
type roomCdn struct {
	Mode   string `json:"mode"`
	Pusher string `json:"pusher"`
}

func getRoomCdn(t testing.TB, c *devcluster.Cluster, room string) roomCdn {
	var rc roomCdn
	api(t, c, "GET", "/v1/rooms/"+room+"/cdn", nil, &rc)
	return rc
}

// waitMode waits until the room's mode in force is mode and returns its state.
func waitMode(t testing.TB, c *devcluster.Cluster, room, mode string) roomCdn {
	t.Helper()
	var rc roomCdn
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if rc = getRoomCdn(t, c, room); rc.Mode != mode || (mode != "CDN_MODE_OFF" && rc.Pusher == "") {
			return fmt.Errorf("room %s: %+v, want %s", room, rc, mode)
		}
		return nil
	})
	return rc
}

// fetchSegment GETs a segment through url's template and decodes it: nil for a 404.
func fetchSegment(t testing.TB, template, room string, windowMs uint32, index int64) *clientpb.Segment {
	t.Helper()
	resp, err := http.Get(segment.URL(template, devcluster.App, room, windowMs, index))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil
	case http.StatusOK:
	default:
		t.Fatalf("segment %d: HTTP %d", index, resp.StatusCode)
	}
	s, err := segment.Decode(body, segment.Want{App: devcluster.App, Room: room, WindowMs: windowMs, Index: index})
	if err != nil {
		t.Fatalf("segment %d: %v", index, err)
	}
	return s
}

// startPusher starts a pusher instance on its own NATS connection, its metrics in reg; kill
// stops it as a crash would: its reports stop, nothing is handed over.
func startPusher(t *testing.T, c *devcluster.Cluster, storage cdnpusher.Config, id string, reg prometheus.Registerer) (kill func()) {
	t.Helper()
	nc, err := bus.Connect(c.NATSURL(), "test pusher "+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	storage.RetryMax, storage.Registerer = 500*time.Millisecond, reg
	svc, err := cdnpusher.StartService(cdnpusher.ServiceConfig{Bus: nc, ID: id, Pusher: storage})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			// An ended context: no report that it leaves, no handoff, nothing more written.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = svc.Shutdown(ctx)
			nc.Close()
		})
	}
	t.Cleanup(kill)
	return kill
}

// metric reads a counter or gauge from the cluster's /metrics (0 when absent).
func metric(t testing.TB, c *devcluster.Cluster, series string) float64 {
	t.Helper()
	resp, err := http.Get(c.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}
