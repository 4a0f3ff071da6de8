package cdnstore

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/testkit"
	pb "roomcast/proto/roomcastpb"
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
	if rc, err := s.RoomCdn(ctx, "a", "r"); err != nil || !rc.Automatic || rc.Mode != pb.CdnMode_CDN_MODE_OFF {
		t.Fatalf("a room never set: %v, %v", rc, err)
	}
	if err := s.SetRoomCdn(ctx, "a", "r", false, pb.CdnMode_CDN_MODE_BULK); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRoute(ctx, "a", "r", &pb.CdnRoute{App: "a", Room: "r", Mode: pb.CdnMode_CDN_MODE_BULK, Pusher: "p1"}); err != nil {
		t.Fatal(err)
	}
	rc, err := s.RoomCdn(ctx, "a", "r")
	if err != nil || rc.Automatic || rc.PinnedMode != pb.CdnMode_CDN_MODE_BULK || rc.Mode != pb.CdnMode_CDN_MODE_BULK || rc.Pusher != "p1" {
		t.Fatalf("a pinned room with its route: %v, %v", rc, err)
	}
	if err := s.SetRoute(ctx, "a", "r", nil); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.RoomCdn(ctx, "a", "r"); err != nil || rc.Mode != pb.CdnMode_CDN_MODE_OFF || rc.Pusher != "" {
		t.Fatalf("after the route's removal: %v, %v", rc, err)
	}
}

// TestCheckPolicy refuses policies an app may not set.
func TestCheckPolicy(t *testing.T) {
	t.Parallel()
	vendor := func(url string) *pb.CdnVendor { return &pb.CdnVendor{UrlTemplate: url} }
	for name, c := range map[string]struct {
		p  *pb.CdnPolicy
		ok bool
	}{
		"empty":          {&pb.CdnPolicy{}, true},
		"a vendor":       {&pb.CdnPolicy{Vendors: []*pb.CdnVendor{vendor("https://cdn.example/{index}")}}, true},
		"no index":       {&pb.CdnPolicy{Vendors: []*pb.CdnVendor{vendor("https://cdn.example/")}}, false},
		"not http":       {&pb.CdnPolicy{Vendors: []*pb.CdnVendor{vendor("ftp://cdn.example/{index}")}}, false},
		"nil vendor":     {&pb.CdnPolicy{Vendors: []*pb.CdnVendor{nil}}, false},
		"slow polling":   {&pb.CdnPolicy{PollIntervalMs: MaxPollInterval + 1}, false},
		"level over one": {&pb.CdnPolicy{FlowControlLevel: 1.5}, false},
		"unknown mode":   {&pb.CdnPolicy{RuleMode: 99}, false},
	} {
		if err := CheckPolicy(c.p); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", name, err, c.ok)
		}
	}
}
