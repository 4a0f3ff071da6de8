package cdnmanager_test

import (
	"fmt"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// In CDN mode a room's bulk lane leaves the long connections for segments on object storage,
// fetched through the dev origin: bulk messages are in segments and not pushed, critical
// messages are pushed and not in segments, a targeted message is pushed (to whom it targets) and
// never in a segment. Setting the mode through the API reaches a connected member live, and so
// does turning it off, after which bulk rides the long connection again.
func TestCdnModeSplitsLanes(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	const room = "stage"
	a := join(t, c, "a", room, "vip")
	if a.ack.Cdn != nil {
		t.Fatalf("LoginAck of a room not in CDN mode has %v", a.ack.Cdn)
	}
	got := map[string]*clientpb.Message{}

	api(t, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_BULK"}, nil)
	// The manager announces the mode once it has heard from a pusher: on a loaded machine a
	// freshly started cluster's pusher may take a few seconds to report.
	cfg := a.cdnConfig(15*time.Second, got)
	if cfg.Mode != clientpb.CdnMode_CDN_MODE_BULK || cfg.WindowMs != 1000 || len(cfg.Vendors) != 1 ||
		cfg.Vendors[0].UrlTemplate != c.CDNOrigin()+"/{app}/{room}/{window_ms}/{index}" {
		t.Fatalf("update frame: %v", cfg)
	}
	waitMode(t, c, room, "CDN_MODE_BULK")
	b := join(t, c, "b", room)
	if b.ack.Cdn.GetMode() != clientpb.CdnMode_CDN_MODE_BULK {
		t.Fatalf("LoginAck in CDN mode: %v", b.ack.Cdn)
	}

	bulk, critical := map[string]bool{}, map[string]bool{}
	var first, last int64
	for i := range 30 {
		id, ms := send(t, c, room, "bulk", fmt.Sprint("bulk ", i), "")
		bulk[id] = true
		if first == 0 {
			first = ms
		}
		last = ms
		if i%10 == 0 {
			id, _ = send(t, c, room, "critical", fmt.Sprint("critical ", i), "")
			critical[id] = true
		}
	}
	targeted, _ := send(t, c, room, "bulk", "for vips", `"vip" in tags`)
	a.pushed(500*time.Millisecond, got)

	for id := range critical {
		if got[id] == nil {
			t.Errorf("critical %s not pushed", id)
		}
	}
	if got[targeted] == nil {
		t.Errorf("targeted bulk %s not pushed to the member it targets", targeted)
	}
	for id := range bulk {
		if got[id] != nil {
			t.Errorf("bulk %s pushed over the long connection in CDN mode", id)
		}
	}

	// Every bulk message is in a segment of its window (or, late, a later one); nothing else is.
	inSegments := map[string]bool{}
	w := cfg.WindowMs
	for i := segment.Index(first, w); i <= segment.Index(last, w)+1; i++ {
		var s *clientpb.Segment
		deadline := time.Now().Add(5 * time.Second)
		for s == nil && time.Now().Before(deadline) {
			if s = fetchSegment(t, cfg.Vendors[0].UrlTemplate, room, w, i); s == nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if s == nil {
			t.Fatalf("segment %d never written", i)
		}
		for _, m := range s.Messages {
			inSegments[m.Id] = true
			if m.Lane != clientpb.Lane_LANE_BULK || m.TagExpr != "" {
				t.Errorf("segment %d holds %v", i, m)
			}
		}
	}
	for id := range bulk {
		if !inSegments[id] {
			t.Errorf("bulk %s in no segment", id)
		}
	}
	if inSegments[targeted] {
		t.Errorf("targeted %s in a public segment", targeted)
	}

	// Off again: the members hear it, bulk comes over the long connection.
	api(t, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_OFF"}, nil)
	if cfg := b.cdnConfig(5*time.Second, got); cfg.Mode != clientpb.CdnMode_CDN_MODE_OFF {
		t.Fatalf("update frame: %v", cfg)
	}
	waitMode(t, c, room, "CDN_MODE_OFF")
	id, _ := send(t, c, room, "bulk", "after", "")
	got = map[string]*clientpb.Message{}
	// Until it comes (a busy machine may take seconds), not for a fixed time.
	for deadline := time.Now().Add(10 * time.Second); got[id] == nil && time.Now().Before(deadline); {
		b.pushed(100*time.Millisecond, got)
	}
	if got[id] == nil {
		t.Errorf("bulk %s not pushed with the mode off", id)
	}
}

// The app's rules put a room in CDN mode by itself once enough members are online, and a
// member connected before hears it live; a changed vendor list reaches the members live too.
func TestCdnModeByRuleAndVendors(t *testing.T) {
	t.Parallel()
	c := startCluster(t, func(cfg *devcluster.Config) { cfg.LeaseInterval = 200 * time.Millisecond })
	const room = "crowd"
	api(t, c, "PUT", "/v1/cdn", map[string]any{"online_threshold": 3}, nil)
	a := join(t, c, "a", room)
	join(t, c, "b", room)
	if rc := getRoomCdn(t, c, room); rc.Mode != "CDN_MODE_OFF" {
		t.Fatalf("two members: %+v", rc)
	}
	join(t, c, "c", room)
	got := map[string]*clientpb.Message{}
	if cfg := a.cdnConfig(5*time.Second, got); cfg.Mode != clientpb.CdnMode_CDN_MODE_BULK {
		t.Fatalf("update frame: %v", cfg)
	}
	api(t, c, "PUT", "/v1/cdn", map[string]any{"online_threshold": 3, "vendors": []map[string]any{
		{"url_template": "https://edge-a.example/{app}/{room}/{window_ms}/{index}", "weight": 3},
		{"url_template": "https://edge-b.example/{app}/{room}/{window_ms}/{index}", "weight": 1, "regions": []string{"AS/CN"}},
	}}, nil)
	// The manager announces the mode once it has heard from a pusher: on a loaded machine a
	// freshly started cluster's pusher may take a few seconds to report.
	cfg := a.cdnConfig(15*time.Second, got)
	if len(cfg.Vendors) != 2 || cfg.Vendors[0].Weight != 3 || cfg.Vendors[1].Regions[0] != "AS/CN" {
		t.Fatalf("vendors update: %v", cfg)
	}
}
