package cdnpusher

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/s3test"
	"roomcast/proto/clientpb"
	"roomcast/store/cdnstore"
)

// startService runs a pusher instance named id on a fresh NATS server and srv, its windows
// closed by clock, with cfg's other fields; it returns the instance and the routes' KV bucket.
func startService(t *testing.T, srv *s3test.Server, id string, cfg Config) (*Service, *testkit.Clock, func(r *buspb.CdnRoute)) {
	t.Helper()
	nc := testkit.Connect(t, testkit.NATS(t))
	clock := testkit.NewClock(time.UnixMilli(t0))
	cfg.Endpoint, cfg.Bucket = srv.Endpoint, s3test.Bucket
	cfg.AccessKey, cfg.SecretKey = s3test.AccessKey, s3test.SecretKey
	cfg.Now = clock.Now
	s, err := StartService(ServiceConfig{Bus: nc, ID: id, Pusher: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // no handoff: no manager runs
		_ = s.Shutdown(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := cdnstore.OpenRoutes(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	put := func(r *buspb.CdnRoute) {
		t.Helper()
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(context.Background(), cdnstore.RouteKey(r.App, r.Room), b); err != nil {
			t.Fatal(err)
		}
	}
	return s, clock, put
}

// A quiet room whose route names the pusher keeps getting a segment for every window, however
// long past Config.Idle it stays quiet: clients poll it for as long as its mode is on.
func TestRoutedRoomNeverIdles(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	s, clock, put := startService(t, srv, "p1", Config{Idle: 3 * time.Second})
	p := s.pusher
	put(&buspb.CdnRoute{App: app, Room: "quiet", Mode: clientpb.CdnMode_CDN_MODE_BULK, Pusher: "p1", FromIndex: t0Index})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if p.Rooms() != 1 {
			return errNotYet
		}
		return nil
	})
	// The sealer's ticker writes each window once the clock passes it; fetch waits for it.
	const windows = 10 // more than 3 times Idle
	for i := range int64(windows) {
		clock.Set(time.UnixMilli((t0Index+i+1)*1000 + p.cfg.Grace.Milliseconds()))
		if s := fetch(t, srv, p, "quiet", t0Index+i); len(s.Messages) != 0 {
			t.Fatalf("quiet window %d: %v", i, s)
		}
	}
	if p.Rooms() != 1 {
		t.Fatalf("%d rooms active, want the routed one", p.Rooms())
	}

	// Leaving CDN mode at a window: written up to it, then forgotten.
	until := int64(t0Index + windows + 2)
	put(&buspb.CdnRoute{App: app, Room: "quiet", Mode: clientpb.CdnMode_CDN_MODE_BULK, Pusher: "p1", FromIndex: t0Index, UntilIndex: until})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if roomEnd(p, "quiet") != until {
			return errNotYet
		}
		return nil
	})
	clock.Set(time.UnixMilli((until+3)*1000 + p.cfg.Grace.Milliseconds()))
	for i := int64(t0Index + windows); i < until; i++ {
		fetch(t, srv, p, "quiet", i)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if p.Rooms() != 0 {
			return errNotYet
		}
		return nil
	})
	missing(t, srv, p, "quiet", until)
}

var errNotYet = errors.New("not yet")

// roomEnd is the end of a room of app the pusher holds (Release), or 0 if it holds none.
func roomEnd(p *Pusher, room string) int64 {
	sh := p.shard(room)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r := sh.rooms[roomKey{app, room}]; r != nil {
		return r.end
	}
	return 0
}
