package sdk_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/sdk"
)

// viewer is a member dialled straight to one ChatLink, recording its member notices.
type viewer struct {
	cl *sdk.Client

	mu      sync.Mutex
	notices []sdk.MemberNoticeEvent
}

func (v *viewer) noticed(uid string, left bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range v.notices {
		if n.UID == uid && n.Left == left {
			return true
		}
	}
	return false
}

func dialViewer(t *testing.T, node *chatlink.Node, uid, room string, tags ...string) *viewer {
	t.Helper()
	v := &viewer{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := sdk.Dial(ctx, sdk.Config{
		Token:     testcluster.Token(t, uid, room, tags...),
		Endpoints: []sdk.Endpoint{{Node: node.Name(), WSURL: node.WSURL(), TCPAddr: node.TCPAddr()}},
		Transport: sdk.TransportTCP,
		OnEvent: func(e sdk.Event) {
			if n, ok := e.(*sdk.MemberNoticeEvent); ok {
				v.mu.Lock()
				v.notices = append(v.notices, *n)
				v.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Errorf("dial %s: %v", uid, err)
		return nil
	}
	v.cl = cl
	return v
}

// waitViewers waits, at most within, until every viewer sees online members and per tag tags.
func waitViewers(t *testing.T, within time.Duration, vs []*viewer, online int64, tags map[string]int64) {
	t.Helper()
	testkit.CheckFor(t, within, 20*time.Millisecond, func() error {
		for i, v := range vs {
			got, gotTags := v.cl.Viewers()
			if got != online || (tags != nil && !maps.Equal(gotTags, tags)) {
				return fmt.Errorf("viewer %d sees %d online, %v by tag; want %d, %v", i, got, gotTags, online, tags)
			}
		}
		return nil
	})
}

// TestViewerCounts: members on two ChatLinks see the room's members online over both, and per
// viewer tag (one per class), after joins and after leaves; a room that asks for member
// notices tells a member on one ChatLink of a join and a leave on the other.
func TestViewerCounts(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(2), func(cfg *devcluster.Config) {
		cfg.ChatLink.ViewerInterval = 100 * time.Millisecond
	})
	const room = "show"
	if code := testcluster.Call(t, c, http.MethodPost, "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"viewer_tags":["class:1","class:2"],"member_notices":true}}`, nil); code != http.StatusCreated {
		t.Fatalf("create room: HTTP %d", code)
	}
	var vs []*viewer
	for i := range 12 {
		v := dialViewer(t, c.Nodes[i%2], fmt.Sprintf("u%d", i), room, fmt.Sprintf("class:%d", 1+i%3))
		if v == nil {
			return
		}
		t.Cleanup(func() { v.cl.Close() })
		vs = append(vs, v)
	}
	waitViewers(t, 20*time.Second, vs, 12, map[string]int64{"class:1": 4, "class:2": 4})

	// A join on node 1 is told to a member on node 0, and its leave.
	late := dialViewer(t, c.Nodes[1], "late", room)
	if late == nil {
		return
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !vs[0].noticed("late", false) {
			return fmt.Errorf("no notice of late's join")
		}
		return nil
	})
	late.cl.Close()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !vs[0].noticed("late", true) {
			return fmt.Errorf("no notice of late's leave")
		}
		return nil
	})

	// Four leave, three of class 1 (u0, u3, u9) and u1 of class 2.
	for _, i := range []int{0, 1, 3, 9} {
		vs[i].cl.Close()
	}
	stay := []*viewer{vs[2], vs[4], vs[5], vs[6], vs[7], vs[8], vs[10], vs[11]}
	waitViewers(t, 20*time.Second, stay, 8, map[string]int64{"class:1": 1, "class:2": 3})
}

// TestViewerCountsLoad: 1,000 members on two ChatLinks join, half of them leave and others join
// again, with the default intervals; after each wave every member online sees the true count
// within the documented bound (the viewer interval, 3 s, plus the report interval, 1 s, plus a
// second of margin for a busy machine).
func TestViewerCountsLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run")
	}
	c := testcluster.Start(t, testcluster.ChatLinks(2))
	const (
		room    = "arena"
		members = 1000
	)
	bound := chatlink.DefaultViewerInterval + time.Second + time.Second + 2*time.Second
	vs := make([]*viewer, members)
	dial := func(from, to int) {
		var wg sync.WaitGroup
		for i := from; i < to; i++ {
			if vs[i] != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				vs[i] = dialViewer(t, c.Nodes[i%2], fmt.Sprintf("v%d", i), room)
			}()
		}
		wg.Wait()
	}
	t.Cleanup(func() {
		for _, v := range vs {
			if v != nil {
				v.cl.Close()
			}
		}
	})
	dial(0, members)
	if t.Failed() {
		return
	}
	online := func() []*viewer {
		var out []*viewer
		for _, v := range vs {
			if v != nil {
				out = append(out, v)
			}
		}
		return out
	}
	// The bound counts from the end of the logins: a member's count is due by then.
	waitViewers(t, bound, online(), members, nil)

	for i := 0; i < members; i += 2 {
		vs[i].cl.Close()
		vs[i] = nil
	}
	waitViewers(t, bound, online(), members/2, nil)

	dial(0, members/2) // the first half's who left come back: 750 online
	waitViewers(t, bound, online(), members*3/4, nil)
}
