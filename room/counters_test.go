package room_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/store/counterstore"
)

// TestCounterWindowAppliedOnce: a ChatLink's window sent again (its answer lost), or an older
// one arriving late, reaches the room service's instances and is applied once; another boot of
// the node, and the API's reset, are applied. Two instances share the room's windows.
func TestCounterWindowAppliedOnce(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.ServiceInstances = 2 })
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	send := func(w *buspb.CounterWindow) map[string]int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.App, w.Room = devcluster.App, "once"
		var rep buspb.Reply
		if err := bus.Request(ctx, nc, bus.SubjectRoomCounters, w, &rep); err != nil || rep.Code != 0 {
			t.Fatalf("window %v: %v, code %d %s", w, err, rep.Code, rep.Message)
		}
		got := make(map[string]int64)
		for _, ct := range rep.Counters.GetCounters() {
			got[ct.Name] = ct.Total
		}
		return got
	}
	likes := func(n int64) []*clientpb.Counter { return []*clientpb.Counter{{Name: "like", Total: n}} }
	steps := []struct {
		w    *buspb.CounterWindow
		want map[string]int64
	}{
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b1", Seq: 5, Adds: likes(3)}, map[string]int64{"like": 3}},
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b1", Seq: 5, Adds: likes(3)}, map[string]int64{"like": 3}},   // sent again
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b1", Seq: 4, Adds: likes(7)}, map[string]int64{"like": 3}},   // older
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b1", Seq: 6, Adds: likes(1)}, map[string]int64{"like": 4}},   // next
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b2", Seq: 1, Adds: likes(10)}, map[string]int64{"like": 14}}, // a new boot
		{&buspb.CounterWindow{Node: "cl-y", Boot: "b1", Seq: 1, Adds: []*clientpb.Counter{{Name: "gift:rose", Total: 2}}}, map[string]int64{"like": 14, "gift:rose": 2}},
		{&buspb.CounterWindow{Resets: []string{"like"}}, map[string]int64{"gift:rose": 2}}, // the API's reset
		{&buspb.CounterWindow{Node: "cl-x", Boot: "b1", Seq: 6, Adds: likes(1)}, map[string]int64{"gift:rose": 2}},
	}
	for i, s := range steps {
		if got := send(s.w); !maps.Equal(got, s.want) {
			t.Fatalf("step %d (%v): totals %v, want %v", i, s.w, got, s.want)
		}
	}
	st, err := counterstore.Open(context.Background(), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := st.Get(context.Background(), devcluster.App, "once")
	if err != nil || !maps.Equal(rec.Totals, map[string]int64{"gift:rose": 2}) {
		t.Errorf("stored %v (%v), want gift:rose 2", rec.GetTotals(), err)
	}

	// Malformed windows are refused, not applied.
	for _, w := range []*buspb.CounterWindow{
		{App: devcluster.App, Room: "once", Node: "cl-x", Boot: "b1", Adds: likes(1)},          // no seq
		{App: devcluster.App, Room: "once", Node: "cl-x", Boot: "b1", Seq: 9, Adds: likes(-1)}, // a negative sum
		{App: devcluster.App, Room: "once", Resets: []string{"no spaces"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var rep buspb.Reply
		err := bus.Request(ctx, nc, bus.SubjectRoomCounters, w, &rep)
		cancel()
		if err != nil || rep.Code != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST) {
			t.Errorf("window %v: %v, code %d; want 100", w, err, rep.Code)
		}
	}
}
