package dispatcher

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTest(t *testing.T) (*Dispatcher, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	d, err := New(Config{Bus: &nats.Conn{}, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return d, clock
}

func report(d *Dispatcher, r *pb.LoadReport) {
	b, _ := proto.Marshal(r)
	d.onReport(&nats.Msg{Data: b})
}

func TestBurstSpreadsBetweenReports(t *testing.T) {
	d, _ := newTest(t)
	for _, n := range []string{"a", "b", "c"} {
		report(d, &pb.LoadReport{Node: n, WsUrl: "ws://" + n})
	}
	report(d, &pb.LoadReport{Node: "busy", WsUrl: "ws://busy", Connections: 100})
	got := map[string]int{}
	for i := 0; i < 300; i++ {
		ans, err := d.Dispatch()
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Nodes) != 3 {
			t.Fatalf("answer lists %d nodes, want 3", len(ans.Nodes))
		}
		got[ans.Nodes[0].Node]++
	}
	// 300 clients on three empty nodes: 100 each, and none to the busy one until they catch up.
	if got["a"] != 100 || got["b"] != 100 || got["c"] != 100 || got["busy"] != 0 {
		t.Fatalf("first choices %v", got)
	}
}

func TestStaleDrainingAndAbsurdNodes(t *testing.T) {
	d, clock := newTest(t)
	report(d, &pb.LoadReport{Node: "old", WsUrl: "ws://old"})
	clock.t = clock.t.Add(2 * time.Second)
	report(d, &pb.LoadReport{Node: "draining", WsUrl: "ws://d", Draining: true})
	report(d, &pb.LoadReport{Node: "negative", WsUrl: "ws://n", Connections: -5})
	report(d, &pb.LoadReport{Node: "", WsUrl: "ws://x"})
	report(d, &pb.LoadReport{Node: "fresh", WsUrl: "ws://fresh"})
	d.onReport(&nats.Msg{Data: []byte{0xff, 0x01}})

	clock.t = clock.t.Add(2 * time.Second) // "old" is now 4s without a report
	ans, err := d.Dispatch()
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Nodes) != 1 || ans.Nodes[0].Node != "fresh" {
		t.Fatalf("answer %+v, want only the fresh node", ans)
	}
	clock.t = clock.t.Add(10 * time.Second)
	if _, err := d.Dispatch(); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("with every node stale: err %v, want ErrNoNodes", err)
	}
}

func TestHTTP(t *testing.T) {
	d, _ := newTest(t)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/dispatch", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("no nodes: HTTP %d, want 503", rec.Code)
	}
	report(d, &pb.LoadReport{Node: "a", WsUrl: "ws://a/v1/ws", TcpAddr: "a:1"})
	rec = httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/dispatch?app=demo&room=r&uid=u", nil))
	var ans Answer
	if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil || rec.Code != 200 {
		t.Fatalf("HTTP %d, body %s, err %v", rec.Code, rec.Body, err)
	}
	if ans.TTLMS != 30000 || len(ans.Nodes) != 1 || ans.Nodes[0] != (Endpoint{Node: "a", WSURL: "ws://a/v1/ws", TCPAddr: "a:1"}) {
		t.Fatalf("answer %+v", ans)
	}
}
