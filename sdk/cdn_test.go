package sdk_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
	"roomcast/sdk"
)

// The CDN tests use short windows so that a run covers many of them.
const (
	testWindow = 200 // ms
	testGrace  = 20  // ms after its window ends, a segment is on the fake vendor
	testJitter = 40  // ms
)

// cdnRoom is a room in CDN mode as a fake ChatLink and fake vendors serve it, on a server clock
// skew ahead of ours. Each window holds four bulk messages, which only the segments carry, but
// for the first, which is also pushed (as around a mode change), to be dropped as a duplicate;
// a critical message is pushed every 50 ms.
type cdnRoom struct {
	t    *testing.T
	skew time.Duration
	link *fakeLink

	mu     sync.Mutex // guards conns and config
	conns  []fakeConn
	config *clientpb.CdnConfig
}

func (r *cdnRoom) serverNow() int64 { return time.Now().Add(r.skew).UnixMilli() }

// bulk returns the bulk messages of window i.
func bulk(i int64) []*clientpb.Message {
	var out []*clientpb.Message
	for k := range int64(4) {
		out = append(out, &clientpb.Message{
			Id: fmt.Sprintf("b%d-%d", i, k), Room: "r1", Lane: clientpb.Lane_LANE_BULK, Type: "danmaku",
			ServerTimeMs: i*testWindow + 10 + k*50, Body: []byte(strconv.FormatInt(i, 10)),
		})
	}
	return out
}

func cdnConfig(vendors ...string) *clientpb.CdnConfig {
	c := &clientpb.CdnConfig{
		Mode: clientpb.CdnMode_CDN_MODE_BULK, WindowMs: testWindow, PollIntervalMs: testWindow, PollJitterMs: testJitter,
	}
	for _, v := range vendors {
		c.Vendors = append(c.Vendors, &clientpb.CdnVendor{UrlTemplate: v + "/{app}/{room}/{window_ms}/{index}", Weight: 1})
	}
	return c
}

// startCdnRoom starts the fake ChatLink; its LoginAck carries config.
func startCdnRoom(t *testing.T, skew time.Duration, config *clientpb.CdnConfig) *cdnRoom {
	r := &cdnRoom{t: t, skew: skew, config: config}
	r.link = startFakeLink(t, r.serve)
	return r
}

func (r *cdnRoom) serve(c fakeConn) {
	f, err := c.recv()
	if err != nil || f.GetLogin() == nil {
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, c)
	config := r.config
	r.mu.Unlock()
	err = c.send(&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{
		SessionId: "cl-1-s1", ServerTimeMs: r.serverNow(), HeartbeatIntervalMs: 60_000,
		App: "demo", Room: "r1", Uid: "u1", Node: "cl-1", Cdn: config,
	}}})
	if err != nil {
		return
	}
	gone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.push(c, gone)
	}()
	answerLoop(c)
	close(gone)
	wg.Wait()
}

// push sends the room's live messages until gone.
func (r *cdnRoom) push(c fakeConn, gone chan struct{}) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lastBulk := r.serverNow()
	lastCritical := lastBulk / 50 * 50
	for n := 0; ; n++ {
		select {
		case <-gone:
			return
		case <-tick.C:
		}
		now := r.serverNow()
		var msgs []*clientpb.Message
		for ; lastCritical+50 <= now; lastCritical += 50 {
			msgs = append(msgs, &clientpb.Message{
				Id: fmt.Sprintf("c%d", lastCritical+50), Room: "r1", Lane: clientpb.Lane_LANE_CRITICAL,
				ServerTimeMs: lastCritical + 50, Body: []byte("critical"),
			})
		}
		for i := segment.Index(lastBulk, testWindow); i <= segment.Index(now, testWindow); i++ {
			if m := bulk(i)[0]; m.ServerTimeMs > lastBulk && m.ServerTimeMs <= now {
				msgs = append(msgs, m)
			}
		}
		lastBulk = now
		if len(msgs) > 0 && c.send(pushFrame(msgs...)) != nil {
			return
		}
	}
}

// reconfigure sends a CdnConfig frame to every connection and makes it the next LoginAck's.
func (r *cdnRoom) reconfigure(config *clientpb.CdnConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.config = config
	for _, c := range r.conns {
		_ = c.send(&clientpb.Frame{Kind: &clientpb.Frame_CdnConfig{CdnConfig: config}})
	}
}

// vendor is a fake CDN. serve answers a request for window index, or returns false to let the
// vendor answer as a good one does: the segment once its window ended plus testGrace, else 404.
type vendor struct {
	*httptest.Server
	room     *cdnRoom
	serve    func(w http.ResponseWriter, index int64) bool
	requests atomic.Int64
}

func startVendor(t *testing.T, room *cdnRoom, serve func(w http.ResponseWriter, index int64) bool) *vendor {
	v := &vendor{room: room, serve: serve}
	v.Server = httptest.NewServer(http.HandlerFunc(v.handle))
	t.Cleanup(v.Close)
	return v
}

func (v *vendor) handle(w http.ResponseWriter, req *http.Request) {
	v.requests.Add(1)
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "demo" || parts[1] != "r1" || parts[2] != strconv.Itoa(testWindow) {
		http.Error(w, "bad path "+req.URL.Path, http.StatusBadRequest)
		return
	}
	index, _ := strconv.ParseInt(parts[3], 10, 64)
	if v.serve != nil && v.serve(w, index) {
		return
	}
	if v.room.serverNow() < (index+1)*testWindow+testGrace {
		http.NotFound(w, req)
		return
	}
	writeSegment(w, goodSegment(index))
}

func goodSegment(index int64) *clientpb.Segment {
	return &clientpb.Segment{
		App: "demo", Room: "r1", WindowMs: testWindow, Index: index, Messages: bulk(index),
		Sampled: 3, NextAtMs: (index+2)*testWindow + testGrace,
	}
}

func writeSegment(w http.ResponseWriter, s *clientpb.Segment) {
	b, err := segment.Encode(s)
	if err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", segment.ContentType)
	w.Header().Set("Content-Encoding", segment.ContentEncoding)
	_, _ = w.Write(b)
}

// released keeps what a Client handed on, and when.
type released struct {
	mu        sync.Mutex
	msgs      []*clientpb.Message
	at        []time.Time
	connected int
}

func (r *released) config(cfg sdk.Config) sdk.Config {
	cfg.OnMessage = func(m *clientpb.Message) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.msgs = append(r.msgs, m)
		r.at = append(r.at, time.Now())
	}
	cfg.OnEvent = func(ev sdk.Event) {
		if _, ok := ev.(*sdk.ConnectedEvent); ok {
			r.mu.Lock()
			r.connected++
			r.mu.Unlock()
		}
	}
	return cfg
}

// check fails t unless the messages handed on so far are in (server time, id) order without a
// repeated id, and returns them by id with when each came.
func (r *released) check(t *testing.T) map[string]time.Time {
	t.Helper()
	seen, inversions := r.order(t)
	if inversions > 0 {
		t.Fatalf("%d messages handed on after a later one", inversions)
	}
	return seen
}

// order fails t if an id was handed on twice, and returns the messages by id with when each
// came, and how many were handed on after a message later in (server time, id) order.
func (r *released) order(t *testing.T) (map[string]time.Time, int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]time.Time{}
	inversions := 0
	for i, m := range r.msgs {
		if _, dup := seen[m.GetId()]; dup {
			t.Fatalf("message %s handed on twice", m.GetId())
		}
		seen[m.GetId()] = r.at[i]
		if i > 0 {
			p := r.msgs[i-1]
			if p.GetServerTimeMs() > m.GetServerTimeMs() || p.GetServerTimeMs() == m.GetServerTimeMs() && p.GetId() > m.GetId() {
				inversions++
			}
		}
	}
	return seen, inversions
}

func dialCdn(t *testing.T, room *cdnRoom, cfg sdk.Config) (*sdk.Client, *released) {
	t.Helper()
	rel := &released{}
	c, err := dialFake(t, sdk.TransportTCP, rel.config(cfg), room.link)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, rel
}

// In CDN mode the Client polls the segments of each window once it is due, merges them with the
// pushed messages, drops the duplicate, and hands everything on in (server time, id) order,
// paced: a window's messages come out over the window, each its play delay after its server
// time. The server's clock may be 30 s off ours either way.
func TestCDNMergesInOrder(t *testing.T) {
	for _, skew := range []time.Duration{0, 30 * time.Second, -30 * time.Second} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			t.Parallel()
			room := startCdnRoom(t, skew, nil)
			v := startVendor(t, room, nil)
			room.config = cdnConfig(v.URL)
			c, rel := dialCdn(t, room, sdk.Config{})
			start := room.serverNow()
			first := segment.Index(start, testWindow) + 1 // the first window wholly after the login

			const windows = 10
			last := first + windows - 1
			testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
				got := rel.check(t)
				for i := first; i <= last; i++ {
					for _, m := range bulk(i) {
						if _, ok := got[m.Id]; !ok {
							return fmt.Errorf("bulk %s not handed on", m.Id)
						}
					}
				}
				return nil
			})
			got := rel.check(t)
			for ms := (first + 1) * testWindow; ms < last*testWindow; ms += 50 {
				if _, ok := got[fmt.Sprintf("c%d", ms)]; !ok {
					t.Errorf("critical c%d not handed on", ms)
				}
			}
			// Paced: the bulk messages of a window (150 ms apart at most) come out over about
			// as long, not at once; and none comes later than its play delay allows.
			// A segment fetched after its play time is handed on at once, by design; the test's
			// fake vendor is only that slow on a starved machine, so under -short one window of
			// the ten may come out unpaced (logged), at full size none.
			playDelay := (testWindow + testGrace + testWindow/10 + testJitter + 300 + 100) * time.Millisecond // + slack
			unpaced, mayBeUnpaced := 0, 0
			if testing.Short() {
				mayBeUnpaced = 1
			}
			for i := first; i <= last; i++ {
				b := bulk(i)
				if spread := got[b[3].Id].Sub(got[b[0].Id]); spread < 100*time.Millisecond {
					if unpaced++; unpaced > mayBeUnpaced {
						t.Errorf("window %d handed on within %v: not paced", i, spread)
					} else {
						t.Logf("window %d handed on within %v: not paced (its segment came late)", i, spread)
					}
				}
				for _, m := range b {
					if late := got[m.Id].Sub(time.UnixMilli(m.ServerTimeMs).Add(-skew)); late > playDelay {
						t.Errorf("%s handed on %v after its server time", m.Id, late)
					}
				}
			}
			st := c.CDNStats()
			if st.Hits < windows || st.Messages < 3*windows || st.Duplicates < windows-1 || st.Sampled != 3*st.Hits || st.Late != 0 || st.Failures != 0 {
				t.Errorf("stats %+v", st)
			}
			// About one poll a window: one when due, seldom a second after a 404.
			if polled := float64(st.Polls) / float64(segment.Index(room.serverNow(), testWindow)-first+2); polled > 1.6 {
				t.Errorf("%.2f polls per window (%+v)", polled, st)
			}
		})
	}
}

// Vendors that fail in every way (garbage, a truncated segment, another room's segment, 5xx, a
// hanging answer) cost the Client failures it counts, not its connection: it falls back to the
// vendor that works, weight 0 or not. A window whose segment never comes (404 for good) counts
// as a gap, and the next windows do not wait for it.
func TestCDNBadVendors(t *testing.T) {
	t.Parallel()
	room := startCdnRoom(t, 0, nil)
	var n atomic.Int64
	bad := startVendor(t, room, func(w http.ResponseWriter, index int64) bool {
		switch n.Add(1) % 5 {
		case 0:
			_, _ = w.Write([]byte("<html>502 bad gateway</html>"))
		case 1:
			b, _ := segment.Encode(goodSegment(index))
			_, _ = w.Write(b[:len(b)/2])
		case 2:
			s := goodSegment(index)
			s.Room = "another"
			writeSegment(w, s)
		case 3:
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		case 4:
			time.Sleep(3 * time.Second) // longer than a fetch may take
			http.Error(w, "too late", http.StatusGatewayTimeout)
		}
		return true
	})
	var holes sync.Map // indexes that stay 404
	good := startVendor(t, room, func(w http.ResponseWriter, index int64) bool {
		if _, ok := holes.Load(index); ok {
			http.NotFound(w, nil)
			return true
		}
		return false
	})
	hole := segment.Index(room.serverNow(), testWindow) + 4
	holes.Store(hole, true)
	config := cdnConfig(bad.URL)
	config.Vendors = append(config.Vendors, &clientpb.CdnVendor{UrlTemplate: good.URL + "/{app}/{room}/{window_ms}/{index}"}) // weight 0
	room.config = config
	c, rel := dialCdn(t, room, sdk.Config{})
	after := hole + 3
	testkit.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		got := rel.check(t)
		for _, m := range bulk(after) {
			if _, ok := got[m.Id]; !ok {
				return fmt.Errorf("bulk %s of window %d not handed on (%+v)", m.Id, after, c.CDNStats())
			}
		}
		return nil
	})
	got := rel.check(t)
	for _, m := range bulk(hole)[1:] { // the first is pushed too
		if _, ok := got[m.Id]; ok {
			t.Errorf("%s of the missing window handed on", m.Id)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if st := c.CDNStats(); st.Failures == 0 || st.Gaps == 0 || st.Misses == 0 {
			return fmt.Errorf("stats %+v, want failures, misses and a gap", st)
		}
		return nil
	})
	if bad.requests.Load() == 0 {
		t.Error("the bad vendor was never tried")
	}
	rel.mu.Lock()
	defer rel.mu.Unlock()
	if rel.connected != 1 || c.Err() != nil {
		t.Errorf("%d connections, err %v: the long link should stay up", rel.connected, c.Err())
	}
}

// A CdnConfig frame with other vendors moves the polls to them at once, on the same connection;
// one with mode off stops the polling, and what was held is handed on.
func TestCDNLiveChange(t *testing.T) {
	t.Parallel()
	room := startCdnRoom(t, 0, nil)
	a, b := startVendor(t, room, nil), startVendor(t, room, nil)
	room.config = cdnConfig(a.URL)
	c, rel := dialCdn(t, room, sdk.Config{})
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if c.CDNStats().Hits < 2 {
			return fmt.Errorf("stats %+v", c.CDNStats())
		}
		return nil
	})
	room.reconfigure(cdnConfig(b.URL))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if b.requests.Load() < 3 {
			return fmt.Errorf("%d requests to the new vendor", b.requests.Load())
		}
		return nil
	})
	before := a.requests.Load()
	time.Sleep(3 * testWindow * time.Millisecond) // three windows' polls
	if n := a.requests.Load() - before; n != 0 {
		t.Errorf("the old vendor was asked %d times after the new one", n)
	}

	off := cdnConfig()
	off.Mode = clientpb.CdnMode_CDN_MODE_OFF
	room.reconfigure(off)
	time.Sleep(50 * time.Millisecond) // a poll under way may end
	before = b.requests.Load()
	time.Sleep(3 * testWindow * time.Millisecond)
	if after := b.requests.Load(); after != before {
		t.Errorf("%d polls with the mode off", after-before)
	}
	// Nothing is held any more: the critical messages come as they are pushed.
	now := room.serverNow()
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		rel.mu.Lock()
		defer rel.mu.Unlock()
		if len(rel.msgs) == 0 || rel.msgs[len(rel.msgs)-1].GetServerTimeMs() < now {
			return fmt.Errorf("no message stamped after %d yet", now)
		}
		return nil
	})
	if delay := time.Since(time.UnixMilli(now)); delay > 500*time.Millisecond {
		t.Errorf("a pushed message took %v with the mode off", delay)
	}
	rel.check(t)
	rel.mu.Lock()
	defer rel.mu.Unlock()
	if rel.connected != 1 {
		t.Errorf("%d connections: a config change must not reconnect", rel.connected)
	}
}

// A poll under way when the mode goes off ends first: its segment's messages come out, in
// order, before the messages pushed after the change. Handing on what was held at once, as the
// change came, let the segment come after them, out of order (TestCDNLiveChange failed so under
// load).
func TestCDNModeOffDuringPoll(t *testing.T) {
	t.Parallel()
	room := startCdnRoom(t, 0, nil)
	var blocked atomic.Int64 // the index whose request waits for release
	asked, release := make(chan struct{}), make(chan struct{})
	v := startVendor(t, room, func(w http.ResponseWriter, index int64) bool {
		if room.serverNow() < (index+1)*testWindow+testGrace || !blocked.CompareAndSwap(0, index) {
			return false
		}
		close(asked)
		<-release
		writeSegment(w, goodSegment(index))
		return true
	})
	// A poll interval of five windows makes the play delay 1.38 s: the segment held back below
	// is still on time when it comes, on a loaded machine too.
	room.config = cdnConfig(v.URL)
	room.config.PollIntervalMs = 5 * testWindow
	c, rel := dialCdn(t, room, sdk.Config{})
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatal("no segment was asked for")
	}
	off := cdnConfig()
	off.Mode = clientpb.CdnMode_CDN_MODE_OFF
	offAt := room.serverNow()
	room.reconfigure(off)
	// Give the messages pushed after the change the chance to come out before the segment:
	// they do (the bug) unless they wait for the poll to end. Either way the wait ends, at the
	// latest after 300 ms, well before the segment's messages are due.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		rel.mu.Lock()
		n := len(rel.msgs)
		pushed := n > 0 && rel.msgs[n-1].GetServerTimeMs() > offAt
		rel.mu.Unlock()
		if pushed {
			break
		}
	}
	close(release)

	// Nothing lost: the segment's messages and those pushed after the change all come.
	want := bulk(blocked.Load())
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		rel.mu.Lock()
		defer rel.mu.Unlock()
		got := map[string]bool{}
		for _, m := range rel.msgs {
			got[m.GetId()] = true
		}
		for _, m := range want {
			if !got[m.GetId()] {
				return fmt.Errorf("%s of the segment polled during the change not handed on", m.GetId())
			}
		}
		if n := len(rel.msgs); n == 0 || rel.msgs[n-1].GetServerTimeMs() <= offAt {
			return fmt.Errorf("no message stamped after the change (%d) yet", offAt)
		}
		return nil
	})
	rel.check(t)
	if st := c.CDNStats(); st.Late != 0 {
		t.Errorf("%d late: %+v", st.Late, st)
	}
}
