package chatlink_test

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"roomcast/chatlink"
	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// TestClusterRunsDefaultLimits: a test cluster that sets no limit runs the deployment's
// (DefaultLimits): a connection's 41st send in a row, one past SendsPerConn's burst of 40, is
// refused with Error 120 by the node, as in production.
func TestClusterRunsDefaultLimits(t *testing.T) {
	t.Parallel()
	clock := newTestClock() // the bucket does not refill while a loaded machine runs the sends
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.ChatLink.Now = clock.now })
	node := c.Nodes[0]
	burst := chatlink.DefaultLimits().SendsPerConn.Burst
	a := testkit.DialTCP(t, node.TCPAddr())
	a.Login(testcluster.Token(t, "alice", "defaults"))
	for seq := uint64(1); seq <= uint64(burst)+1; seq++ {
		a.Send(sendFrame(seq, "hi"))
		var f *clientpb.Frame
		for f = a.Next(); f.GetSendAck() == nil && f.GetError() == nil; f = a.Next() {
		}
		switch e := f.GetError(); {
		case seq <= uint64(burst) && e != nil:
			t.Fatalf("send %d of a burst of %d refused: %v", seq, burst, e)
		case seq > uint64(burst) && (e == nil || e.Code != uint32(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED)):
			t.Fatalf("send %d, past the default burst of %d: want Error 120, got %v", seq, burst, f)
		}
	}
	if n := limitedCount(t, c, node.Name(), "send_conn"); n != 1 {
		t.Fatalf("limited_total{send_conn} = %d, want 1", n)
	}
}

// TestDefaultLimitsLetABigRoomIn: with the default limits on, a 60,000-member room joining
// over a minute at 1,000/s on average (random arrivals, as a crowd comes) meets no refusal
// from the room's join rate, and a carrier-grade NAT address with a thousand of those viewers
// (arriving in the same minute, half of them in its first second) none from the per-address
// login rate; the per-address connections hold them all.
func TestDefaultLimitsLetABigRoomIn(t *testing.T) {
	t.Parallel()
	lim := chatlink.DefaultLimits()
	if lim.JoinsPerRoom.Off() || lim.LoginsPerIP.Off() || lim.ConnectionsPerIP <= 0 {
		t.Fatalf("default limits %+v: joins per room, logins and connections per address should be on", lim)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rooms := ratelimit.NewTable[string](16)
	now, refused := start, 0
	for range 60000 {
		now = now.Add(time.Duration(rng.ExpFloat64() * float64(time.Millisecond)))
		if ok, _ := rooms.Take("big", lim.JoinsPerRoom, now); !ok {
			refused++
		}
	}
	if refused > 0 || now.Sub(start) > 70*time.Second {
		t.Errorf("60,000 joins over %v: %d refused by the default %v per room", now.Sub(start), refused, lim.JoinsPerRoom)
	}
	addrs := ratelimit.NewTable[netip.Addr](16)
	nat := netip.MustParseAddr("100.64.0.1")
	refused = 0
	// In time order: 500 in the first second, 500 over the next 59.
	times := make([]time.Time, 0, 1000)
	for range 500 {
		times = append(times, start.Add(time.Duration(rng.Int64N(int64(time.Second)))))
	}
	for i := range 500 {
		times = append(times, start.Add(time.Second+time.Duration(i)*59*time.Second/500))
	}
	slices.SortFunc(times, time.Time.Compare)
	for _, at := range times {
		if ok, _ := addrs.Take(nat, lim.LoginsPerIP, at); !ok {
			refused++
		}
	}
	if refused > 0 {
		t.Errorf("1,000 viewers behind one address: %d refused by the default %v per address", refused, lim.LoginsPerIP)
	}
	if lim.ConnectionsPerIP < 1000 {
		t.Errorf("the default %d connections per address does not hold 1,000 viewers behind one", lim.ConnectionsPerIP)
	}
}
