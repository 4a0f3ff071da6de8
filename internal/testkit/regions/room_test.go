package regions_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/chatlink"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/regions"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// Three regions on three continents: the home region, where the services and JetStream
// stand, and two far ones, one 40 ms away and one 150 ms.
var (
	threeRegions = []string{"eu", "na", "as"}
	oneWay       = map[[2]string]time.Duration{
		{"eu", "na"}: 40 * time.Millisecond,
		{"eu", "as"}: 150 * time.Millisecond,
		{"na", "as"}: 100 * time.Millisecond,
	}
	dispatchRegion = map[string]string{"eu": "EU/DE", "na": "NA/US", "as": "AS/SG"}
)

// The harness's size: `make test` runs the tests at their short size (-short), `make chaos`
// at the (docs/regions.md), which is also their size without -short. Either is
// overridden by the environment: sendEnv, how long TestRoomAcrossRegions's member sends, and
// cutEnv, how long TestRegionCut cuts the far region (Go durations). A cut much longer than
// 25 s fails TestRegionCut as it should: the ChatLinks' gap reads look 30 s back at most, and
// the cut's first messages are lost (docs/regions.md).
const (
	sendEnv = "ROOMCAST_REGIONS_SEND"
	cutEnv  = "ROOMCAST_REGIONS_CUT"
)

// size returns the duration env gives, or short with -short, or full.
func size(t *testing.T, env string, short, full time.Duration) time.Duration {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			t.Fatalf("%s=%q: want a duration of a second or more", env, v)
		}
		return d
	}
	if testing.Short() {
		return short
	}
	return full
}

func delay(a, b string) time.Duration {
	if d, ok := oneWay[[2]string{a, b}]; ok {
		return d
	}
	return oneWay[[2]string{b, a}]
}

// TestRoomAcrossRegions is the wide-area must-show at a small size (docs/regions.md): three
// regions, two ChatLinks in each, one room with members on every ChatLink, one member of the
// home region sending 20 messages a second. The room's broadcast crosses each gateway once per
// room batch, not once per ChatLink that holds members there (NATS's own gateway counts); every
// member gets every message; and the far region's p99 from send to receipt is within the link's
// delay plus 250 ms of the home region's.
func TestRoomAcrossRegions(t *testing.T) {
	t.Parallel()
	duration := size(t, sendEnv, 3*time.Second, 60*time.Second)
	const (
		perRegion = 2  // ChatLinks
		perNode   = 3  // members on each ChatLink
		rate      = 20 // messages a second
		room      = "world"
	)
	w := startWorld(t, perRegion, perNode, room)
	sc, members, sender := w.sc, w.members, w.sender
	home := sc.Home()

	// The room's batches, counted where they are made: the home region.
	nc, err := nats.Connect(sc.URL(home))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var batches atomic.Int64
	if _, err := nc.Subscribe("rc.room."+devcluster.App+"."+room, func(*nats.Msg) { batches.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	gateways := func() map[[2]string]int64 {
		out := make(map[[2]string]int64)
		for _, a := range threeRegions {
			for _, b := range threeRegions {
				if a != b {
					st, err := sc.Gateway(a, b)
					if err != nil {
						t.Fatal(err)
					}
					out[[2]string{a, b}] = st.Msgs
				}
			}
		}
		return out
	}
	// What crosses the gateways with no room traffic: leases, load reports, presence.
	idleFrom, idleStart := gateways(), time.Now()
	time.Sleep(time.Second)
	idleTo, idle := gateways(), time.Since(idleStart)

	// Every member reads until it has every message, noting when each came.
	total := int(duration.Seconds()) * rate
	type receipt struct {
		region string
		got    int
		lat    []time.Duration
	}
	receipts := make([]receipt, len(members))
	var wg sync.WaitGroup
	deadline := time.Now().Add(duration + 30*time.Second)
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := make(map[string]bool)
			r := receipt{region: m.region}
			defer func() { receipts[i] = r }()
			for len(seen) < total {
				var f *clientpb.Frame
				select {
				case f = <-m.client.Frames():
				case <-time.After(time.Until(deadline)):
					return
				}
				for _, msg := range f.GetPush().GetMessages() {
					sent, err := strconv.ParseInt(string(msg.Body), 10, 64)
					if err != nil || seen[msg.Id] {
						continue
					}
					seen[msg.Id] = true
					r.lat = append(r.lat, time.Since(time.Unix(0, sent)))
				}
				r.got = len(seen)
			}
		}()
	}
	// The sender's acks are drained so its buffer never fills.
	go func() {
		for f := range sender.Frames() {
			if f.GetSendAck() == nil && f.GetPush() == nil {
				t.Logf("sender got %v", f)
			}
		}
	}()

	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var from, to map[[2]string]int64
	var batchesFrom, batchesTo int64
	var measured time.Duration
	var measureStart time.Time
	for seq := 1; seq <= total; seq++ {
		<-tick.C
		// Measure the steady part: from the first second to the last.
		if seq == rate+1 {
			from, batchesFrom, measureStart = gateways(), batches.Load(), time.Now()
		}
		sender.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
			Seq: uint64(seq), Type: "chat", Body: []byte(strconv.FormatInt(time.Now().UnixNano(), 10)),
		}}})
		if seq == total-rate/2 {
			to, batchesTo, measured = gateways(), batches.Load(), time.Since(measureStart)
		}
	}
	wg.Wait()
	farSend(t, members, delay(home, threeRegions[2]))

	windowsPerSecond := float64(batchesTo-batchesFrom) / measured.Seconds()
	t.Logf("the room's batches: %.1f/s over %v", windowsPerSecond, measured.Round(time.Millisecond))
	for _, a := range threeRegions {
		for _, b := range threeRegions {
			if a == b {
				continue
			}
			k := [2]string{a, b}
			idleRate := float64(idleTo[k]-idleFrom[k]) / idle.Seconds()
			rate := float64(to[k]-from[k]) / measured.Seconds()
			t.Logf("gateway %s->%s: %.1f msgs/s in the broadcast, %.1f/s idle", a, b, rate, idleRate)
			if a != home {
				continue
			}
			// The broadcast adds one message per batch to each link, whatever the number of
			// ChatLinks with members there; the idle traffic is allowed beside it, with 5 a
			// second for what the short idle sample missed (answers to the far ChatLinks'
			// requests: 1-2 a second). A copy per ChatLink would be windows x perRegion,
			// 30 a second and more.
			if limit := windowsPerSecond + idleRate + 5; rate > limit {
				t.Errorf("gateway %s->%s carried %.1f msgs/s, want at most the room's %.1f batches/s (+ %.1f/s idle): once per batch, not per ChatLink",
					a, b, rate, windowsPerSecond, idleRate)
			}
		}
	}

	p99 := make(map[string]time.Duration)
	for _, region := range threeRegions {
		var lat []time.Duration
		for _, r := range receipts {
			if r.region != region {
				continue
			}
			if r.got != total {
				t.Errorf("a member in %s got %d of %d messages", region, r.got, total)
			}
			lat = append(lat, r.lat...)
		}
		slices.Sort(lat)
		if len(lat) == 0 {
			continue
		}
		p99[region] = lat[len(lat)*99/100]
		t.Logf("%s (%v from %s): send to receipt p50 %v, p99 %v over %d receipts", region, delay(home, region), home,
			lat[len(lat)/2].Round(time.Millisecond), p99[region].Round(time.Millisecond), len(lat))
	}
	for _, region := range threeRegions[1:] {
		if limit := p99[home] + delay(home, region) + 250*time.Millisecond; p99[region] > limit {
			t.Errorf("p99 in %s is %v, want within %v (home's p99 %v + the link's %v + 250ms)",
				region, p99[region], limit, p99[home], delay(home, region))
		}
	}
}

// world is three regions with a room whose members stand on every ChatLink.
type world struct {
	sc      *regions.Supercluster
	c       *devcluster.Cluster
	members []member
	sender  *testkit.Client // a member on the home region's first ChatLink
}

type member struct {
	region string
	client *testkit.Client
}

// startWorld starts the three regions, perRegion ChatLinks in each and the services in the home
// region, and logs perNode members into room on each ChatLink, and a sender in the home region.
// opts are more options of the cluster's.
func startWorld(t *testing.T, perRegion, perNode int, room string, opts ...testcluster.Option) world {
	sc := regions.Start(t, regions.Config{Regions: threeRegions, Delay: delay})
	// One member sends the whole room's 20 a second: faster than the send limits let a person.
	c := testcluster.Regions(t, sc, perRegion, append(opts, testcluster.NoSendLimits(), func(cfg *devcluster.Config) {
		cfg.PerNode = func(n *chatlink.Config) {
			i, _ := strconv.Atoi(n.Node[len("cl-"):])
			n.Region = dispatchRegion[threeRegions[(i-1)/perRegion]]
		}
	})...)

	// The room passes every message: 20 a second is the members' default budget exactly, and at
	// that edge flow control thins some (docs/edge.md).
	if code := testcluster.Call(t, c, "POST", "/v1/rooms", devcluster.APIKey,
		`{"room":"`+room+`","settings":{"normal_budget":-1}}`, nil); code != 201 {
		t.Fatalf("create the room: HTTP %d", code)
	}

	var members []member
	loginTime := make(map[string]time.Duration) // the slowest login, by region
	for i, node := range c.Nodes {
		region := threeRegions[i/perRegion]
		for j := range perNode {
			cl := testkit.DialTCP(t, node.TCPAddr())
			start := time.Now()
			cl.Login(testcluster.Token(t, fmt.Sprintf("%s-%s-%d", region, node.Name(), j), room))
			loginTime[region] = max(loginTime[region], time.Since(start))
			members = append(members, member{region, cl})
		}
	}
	for _, region := range threeRegions {
		t.Logf("%s: the slowest login took %v", region, loginTime[region].Round(time.Millisecond))
	}
	sender := testkit.DialTCP(t, c.Nodes[0].TCPAddr())
	sender.Login(testcluster.Token(t, "sender", room))

	return world{sc, c, members, sender}
}

// TestRegionCut cuts the far region's gateways for a while as the home region's member sends,
// and reports what each region's members received, what the far ChatLinks did about the gap,
// and what a far member's send got during the cut. It checks what docs/regions.md says of a
// cut: the regions still joined lose nothing, and the cut region's members, once it is back,
// have every message, the room's history holding the whole cut.
func TestRegionCut(t *testing.T) {
	t.Parallel()
	cut := size(t, cutEnv, 5*time.Second, 20*time.Second)
	const (
		perRegion = 2
		perNode   = 2
		rate      = 20
		room      = "cut"
		far       = "as"
	)
	// The room's history holds the whole run (20 a second for the cut and 5 s around it, 10 s
	// to spare; the default keeps 100), so that the far ChatLinks can fill the cut's gap from it.
	history := max(1000, rate*int((cut+15*time.Second).Seconds()))
	w := startWorld(t, perRegion, perNode, room, func(cfg *devcluster.Config) { cfg.Room.HistoryPerRoom = history })
	farSender := w.members[len(w.members)-1].client // a member of the far region's last ChatLink

	type tally struct {
		mu   sync.Mutex
		ids  map[string]bool
		gaps int // Push frames that say messages were thinned or lost
	}
	tallies := make([]*tally, len(w.members))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var farAnswers []string // what the far member's sends got, in order
	var farMu sync.Mutex
	for i, m := range w.members {
		tallies[i] = &tally{ids: make(map[string]bool)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case f := <-m.client.Frames():
					tl := tallies[i]
					tl.mu.Lock()
					for _, msg := range f.GetPush().GetMessages() {
						if msg.Sender == "sender" {
							tl.ids[msg.Id] = true
						}
					}
					if f.GetPush().GetThinned() != nil {
						tl.gaps++
					}
					tl.mu.Unlock()
					if m.client == farSender {
						farMu.Lock()
						switch {
						case f.GetSendAck() != nil:
							farAnswers = append(farAnswers, "ack")
						case f.GetError() != nil:
							farAnswers = append(farAnswers, fmt.Sprintf("error %d %s", f.GetError().GetCode(), f.GetError().GetMessage()))
						}
						farMu.Unlock()
					}
				}
			}
		}()
	}
	go func() {
		for range w.sender.Frames() {
		}
	}()

	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var sent, farSent int
	send := func(until time.Time, farToo bool) {
		for time.Now().Before(until) {
			<-tick.C
			sent++
			w.sender.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
				Seq: uint64(sent), Type: "chat", Body: []byte(strconv.Itoa(sent)),
			}}})
			if farToo && sent%rate == 0 { // one a second from the far member
				farSent++
				farSender.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
					Seq: uint64(farSent), Type: "chat", Body: []byte("far"),
				}}})
			}
		}
	}
	send(time.Now().Add(2*time.Second), false)
	if err := w.sc.Cut(far); err != nil {
		t.Fatal(err)
	}
	cutAt := sent
	send(time.Now().Add(cut), true)
	// Presence, in the home region, heard nothing from the cut region's ChatLinks for longer than
	// their lease (3 s in the test cluster): it has dropped their sessions, and emitted a logout
	// for each.
	all, farMembers := float64(len(w.members)+1), 0.0 // the members and the sender
	for _, m := range w.members {
		if m.region == far {
			farMembers++
		}
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		sessions, logouts := metric(t, w.c, "roomcast_presence_sessions"), metric(t, w.c, `roomcast_presence_lease_end_logouts_total{result="emitted"}`)
		if sessions != all-farMembers || logouts != farMembers {
			return fmt.Errorf("presence counts %v sessions and emitted %v lease-end logouts at the end of the cut; want %v and %v (the cut region's dropped)",
				sessions, logouts, all-farMembers, farMembers)
		}
		return nil
	})
	logMetrics(t, w.c, "before the heal: ", "roomcast_presence_sessions", "roomcast_presence_lease_end_logouts_total")
	healStart := time.Now()
	if err := w.sc.Heal(far); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut %s for %v (messages %d..%d sent meanwhile); gateways back %v after the heal",
		far, cut, cutAt+1, sent, time.Since(healStart).Round(time.Millisecond))
	send(time.Now().Add(3*time.Second), false)

	// Wait for the regions still joined to have everything, and the far one to settle.
	received := func(i int) int {
		tallies[i].mu.Lock()
		defer tallies[i].mu.Unlock()
		return len(tallies[i].ids)
	}
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for i, m := range w.members {
			if m.region != far && received(i) < sent {
				return fmt.Errorf("a member in %s has %d of %d", m.region, received(i), sent)
			}
		}
		return nil
	})
	// The far region's members: the ChatLinks' gap reads (order hold, a history read over the
	// link) come within a few seconds of the heal.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		all := true
		for i := range w.members {
			all = all && received(i) >= sent
		}
		if all {
			break
		}
	}
	close(stop)
	wg.Wait()
	// Once the cut region's reports arrive again, presence finds its counts short of theirs
	// and asks those ChatLinks for a snapshot: their sessions are back.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if sessions := metric(t, w.c, "roomcast_presence_sessions"); sessions != all {
			return fmt.Errorf("presence counts %v sessions after the heal, want %v", sessions, all)
		}
		return nil
	})

	for _, region := range threeRegions {
		least, most, gaps := sent, 0, 0
		for i, m := range w.members {
			if m.region != region {
				continue
			}
			least, most = min(least, received(i)), max(most, received(i))
			gaps += tallies[i].gaps
		}
		t.Logf("%s: members received %d..%d of %d (thinned notices %d)", region, least, most, sent, gaps)
		switch {
		case region != far && least < sent:
			t.Errorf("a member in %s, not cut, lost messages: %d of %d", region, least, sent)
		case least < sent:
			t.Errorf("a member in %s, cut, has %d of %d after the heal: the room's history held them all", region, least, sent)
		}
	}
	farMu.Lock()
	t.Logf("the far member's %d sends during the cut got: %v", farSent, farAnswers)
	farMu.Unlock()
	logMetrics(t, w.c, "at the end: ", "roomcast_chatlink_order_total", "roomcast_presence_sessions", "roomcast_presence_lease_end_logouts_total")
}

// metric returns the value of the series of c's metrics named series (with its labels), 0 if
// it has none.
func metric(t *testing.T, c *devcluster.Cluster, series string) float64 {
	t.Helper()
	resp, err := http.Get(c.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", series, line)
			}
			return f
		}
	}
	return 0
}

// logMetrics logs the series of c's metrics whose names start with one of names.
func logMetrics(t *testing.T, c *devcluster.Cluster, prefix string, names ...string) {
	t.Helper()
	resp, err := http.Get(c.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		for _, name := range names {
			if strings.HasPrefix(line, name) && !strings.HasSuffix(line, " 0") {
				t.Log(prefix + line)
			}
		}
	}
}

// farSend measures what a member in the far region (the last of members) pays to send: it sends
// 10 messages, one every 100 ms, and the test logs its SendAcks' round trip and the members'
// receipts by region. A far member's message goes to the room service in the home region and
// comes back in the room's batch: it crosses the link twice before its own region sees it.
func farSend(t *testing.T, members []member, oneWay time.Duration) {
	t.Helper()
	const n = 10
	far := members[len(members)-1]
	acks := make(chan time.Duration, n)
	sentAt := make([]time.Time, n+1)
	var mu sync.Mutex
	go func() {
		for f := range far.client.Frames() {
			if ack := f.GetSendAck(); ack != nil {
				mu.Lock()
				acks <- time.Since(sentAt[ack.Seq])
				mu.Unlock()
			}
		}
	}()
	// Every other member reads as the messages come.
	lats := make([][]time.Duration, len(members)-1)
	var wg sync.WaitGroup
	deadline := time.Now().Add(15 * time.Second)
	for i, m := range members[:len(members)-1] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(lats[i]) < n {
				var f *clientpb.Frame
				select {
				case f = <-m.client.Frames():
				case <-time.After(time.Until(deadline)):
					return
				}
				for _, msg := range f.GetPush().GetMessages() {
					if sent, err := strconv.ParseInt(string(msg.Body), 10, 64); err == nil {
						lats[i] = append(lats[i], time.Since(time.Unix(0, sent)))
					}
				}
			}
		}()
	}
	for seq := 1; seq <= n; seq++ {
		mu.Lock()
		sentAt[seq] = time.Now()
		mu.Unlock()
		far.client.Send(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
			Seq: uint64(seq), Type: "chat", Body: []byte(strconv.FormatInt(time.Now().UnixNano(), 10)),
		}}})
		time.Sleep(100 * time.Millisecond)
	}
	var ackMax time.Duration
	for range n {
		select {
		case d := <-acks:
			ackMax = max(ackMax, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("the far member's sends were not all acknowledged")
		}
	}
	t.Logf("a member in %s (%v from home) sending: SendAck at most %v after the send", far.region, oneWay, ackMax.Round(time.Millisecond))
	wg.Wait()
	byRegion := make(map[string][]time.Duration)
	for i, m := range members[:len(members)-1] {
		if len(lats[i]) < n {
			t.Errorf("a member in %s got %d of the far member's %d messages", m.region, len(lats[i]), n)
		}
		byRegion[m.region] = append(byRegion[m.region], lats[i]...)
	}
	for _, region := range threeRegions {
		lat := byRegion[region]
		slices.Sort(lat)
		if len(lat) > 0 {
			t.Logf("  received in %s: p50 %v, max %v", region, lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
		}
	}
}
