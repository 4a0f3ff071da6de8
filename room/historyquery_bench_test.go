package room

import (
	"context"
	"fmt"
	"testing"
	"time"

	"roomcast/internal/buspb"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// BenchmarkHistoryPage measures one page of a room that keeps 100 messages (the deployment's
// default), as the room service answers it: the newest 50, and the 50 after a cursor (which
// starts reading at the cursor). cpu-ns/op is the process's CPU per page, the NATS server's
// (with JetStream, in this process) included.
func BenchmarkHistoryPage(b *testing.B) {
	ns, err := devnats.Start(devnats.Config{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc := testkit.Connect(b, ns)
	s, err := New(Config{Bus: nc})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const app, room = "bench", "hall"
	now := time.Now()
	msgs := make([]*clientpb.Message, 150)
	for i := range msgs {
		msgs[i] = &clientpb.Message{Id: s.ids.New(now), Room: room, Lane: clientpb.Lane_LANE_NORMAL, Body: []byte(fmt.Sprint("message ", i)), ServerTimeMs: now.UnixMilli()}
	}
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.hist.record(wctx, app, msgs, nil); err != nil {
		b.Fatal("history not written: ", err)
	}
	first := s.historyPage(ctx, &buspb.HistoryRequest{App: app, Room: room, Query: &clientpb.HistoryQuery{Limit: 50}})
	if n := len(first.GetHistory().GetMessages()); n != 50 {
		b.Fatalf("first page: %d messages, %v", n, first)
	}
	// A cursor of the newer direction: the page after the kept window's first 25.
	kept, _, err := historystore.Read(ctx, s.hist.js, app, room, historystore.Range{})
	if err != nil || len(kept) != 100 {
		b.Fatalf("kept %d, %v", len(kept), err)
	}
	newer := historyCursor{seq: kept[24].Seq}.String()
	for _, bc := range []struct {
		name string
		q    *clientpb.HistoryQuery
	}{
		{"newest", &clientpb.HistoryQuery{Limit: 50}},
		{"after-cursor", &clientpb.HistoryQuery{Limit: 50, Cursor: newer}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			before := testkit.ProcessCPU()
			for b.Loop() {
				rep := s.historyPage(ctx, &buspb.HistoryRequest{App: app, Room: room, Query: bc.q, AsMember: true, Uid: "u"})
				if len(rep.GetHistory().GetMessages()) != 50 {
					b.Fatalf("page: %v", rep)
				}
			}
			b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
