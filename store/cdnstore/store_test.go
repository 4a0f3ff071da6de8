package cdnstore

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// TestRoomCdn reads what an app asked for a room and what its route puts in force.
func TestRoomCdn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc := testkit.Connect(t, testkit.NATS(t))
	s, err := OpenStore(ctx, nc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := s.RoomCdn(ctx, "a", "r"); err != nil || !rc.Automatic || rc.Mode != clientpb.CdnMode_CDN_MODE_OFF {
		t.Fatalf("a room never set: %v, %v", rc, err)
	}
	if err := s.SetRoomCdn(ctx, "a", "r", false, clientpb.CdnMode_CDN_MODE_BULK); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRoute(ctx, "a", "r", &buspb.CdnRoute{App: "a", Room: "r", Mode: clientpb.CdnMode_CDN_MODE_BULK, Pusher: "p1"}); err != nil {
		t.Fatal(err)
	}
	rc, err := s.RoomCdn(ctx, "a", "r")
	if err != nil || rc.Automatic || rc.PinnedMode != clientpb.CdnMode_CDN_MODE_BULK || rc.Mode != clientpb.CdnMode_CDN_MODE_BULK || rc.Pusher != "p1" {
		t.Fatalf("a pinned room with its route: %v, %v", rc, err)
	}
	if err := s.SetRoute(ctx, "a", "r", nil); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.RoomCdn(ctx, "a", "r"); err != nil || rc.Mode != clientpb.CdnMode_CDN_MODE_OFF || rc.Pusher != "" {
		t.Fatalf("after the route's removal: %v, %v", rc, err)
	}
}

// TestCheckPolicy refuses policies an app may not set.
func TestCheckPolicy(t *testing.T) {
	t.Parallel()
	vendor := func(url string) *clientpb.CdnVendor { return &clientpb.CdnVendor{UrlTemplate: url} }
	for name, c := range map[string]struct {
		p  *apipb.CdnPolicy
		ok bool
	}{
		"empty":          {&apipb.CdnPolicy{}, true},
		"a vendor":       {&apipb.CdnPolicy{Vendors: []*clientpb.CdnVendor{vendor("https://cdn.example/{index}")}}, true},
		"no index":       {&apipb.CdnPolicy{Vendors: []*clientpb.CdnVendor{vendor("https://cdn.example/")}}, false},
		"not http":       {&apipb.CdnPolicy{Vendors: []*clientpb.CdnVendor{vendor("ftp://cdn.example/{index}")}}, false},
		"nil vendor":     {&apipb.CdnPolicy{Vendors: []*clientpb.CdnVendor{nil}}, false},
		"slow polling":   {&apipb.CdnPolicy{PollIntervalMs: MaxPollInterval + 1}, false},
		"level over one": {&apipb.CdnPolicy{FlowControlLevel: 1.5}, false},
		"unknown mode":   {&apipb.CdnPolicy{RuleMode: 99}, false},
	} {
		if err := CheckPolicy(c.p); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", name, err, c.ok)
		}
	}
}
