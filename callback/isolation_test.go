package callback_test

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/callback"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// The isolation set-up: app "other" has a login callback, and its clients log in at a steady
// rate the whole time. Its backend either answers at once or hangs (each call then ends at the
// 1s timeout and fails open; the breaker never opens, so the pool stays full of hanging calls,
// its queue full, and the rest rejected). The second app (devcluster.App) has no callback; its
// logins are timed while the other app's callback answers and while it hangs: the only
// difference between the two is the failing callback.
const (
	appOther        = "other"
	hangingTimeout  = time.Second
	hangingPool     = 8
	hangingQueue    = 8
	otherLoginEvery = 25 * time.Millisecond // 40 logins a second
)

type isolationRig struct {
	tcp      string
	inFlight atomic.Int64 // calls the backend holds

	mu      sync.Mutex    // guards release
	release chan struct{} // open while the backend hangs; closed: it answers
}

func startIsolationRig(tb testing.TB) *isolationRig {
	rig := &isolationRig{release: make(chan struct{})}
	close(rig.release)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rig.inFlight.Add(1)
		defer rig.inFlight.Add(-1)
		// The server notices the caller hanging up only once the body has been read.
		_, _ = io.Copy(io.Discard, r.Body)
		rig.mu.Lock()
		release := rig.release
		rig.mu.Unlock()
		select {
		case <-release:
			_, _ = io.WriteString(w, `{"allow":true}`)
		case <-r.Context().Done():
		}
	}))
	tb.Cleanup(backend.Close) // after the cluster's Close, which ends the calls
	c := testcluster.Start(tb, testcluster.ChatLinks(1), withApps(appOther), withCallbacks(map[string]callback.AppConfig{
		appOther: {
			LoginURL: backend.URL, Secret: secret, Timeout: hangingTimeout, MaxConcurrent: hangingPool, MaxQueued: hangingQueue,
			// The worst case: a breaker that never opens keeps the pool full of hanging calls.
			Breaker: callback.BreakerConfig{Failures: math.MaxInt, FailureRate: 2},
		},
	}))
	rig.tcp = c.Nodes[0].TCPAddr()
	return rig
}

// hang makes the backend hang (true) or answer at once, the calls it holds too.
func (rig *isolationRig) hang(on bool) {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	select {
	case <-rig.release:
		if on {
			rig.release = make(chan struct{})
		}
	default:
		if !on {
			close(rig.release)
		}
	}
}

// login logs in with tok over TCP and returns how long the login took (from the Login frame
// to the answer) and the answer.
func (rig *isolationRig) login(tok string) (time.Duration, *clientpb.Frame, error) {
	conn, err := net.Dial("tcp", rig.tcp)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if err := testkit.WriteFrame(conn, &clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: tok, Device: "test"}}}); err != nil {
		return 0, nil, err
	}
	f, err := testkit.ReadFrame(conn)
	return time.Since(start), f, err
}

// otherLoad logs the other app's clients in, one every otherLoginEvery, until the returned
// function is called; that function waits for the logins in flight and returns the first
// error.
func (rig *isolationRig) otherLoad(tb testing.TB) (stop func() error) {
	toks := make([]string, 64) // uids o0..o63 in turn
	for i := range toks {
		toks[i] = token(tb, appOther, fmt.Sprint("o", i), "iso")
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	wg.Go(func() {
		tick := time.NewTicker(otherLoginEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			tok := toks[i%len(toks)]
			wg.Go(func() {
				if _, f, err := rig.login(tok); err != nil || f.GetLoginAck() == nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("other app's login: %v, %v", f, err) })
				}
			})
		}
	})
	return func() error {
		close(done)
		wg.Wait()
		return firstErr
	}
}

// measure times n logins of the second app, one after the other, and returns their latencies.
func (rig *isolationRig) measure(tb testing.TB, n int) []time.Duration {
	lat := make([]time.Duration, 0, n)
	for i := range n {
		d, f, err := rig.login(token(tb, devcluster.App, fmt.Sprint("b", i), "iso"))
		if err != nil || f.GetLoginAck() == nil {
			tb.Fatalf("second app's login %d: %v, %v", i, f, err)
		}
		lat = append(lat, d)
	}
	return lat
}

// p99 returns the 99th percentile of lat (nearest rank).
func p99(lat []time.Duration) time.Duration { return percentile(lat, 99) }

// percentile returns the p-th percentile of lat (nearest rank).
func percentile(lat []time.Duration, p int) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[max(0, (len(s)*p+99)/100-1)]
}

// runIsolation alternates the other app's callback answering and hanging (so that drift in the
// machine's load falls on both) and returns the second app's login latencies of
// each.
func runIsolation(tb testing.TB, rig *isolationRig, rounds, perRound int) (answering, hanging []time.Duration) {
	stop := rig.otherLoad(tb)
	defer func() {
		rig.hang(false)
		if err := stop(); err != nil {
			tb.Error(err)
		}
	}()
	for round := range rounds {
		// Each way first in every other round: what drifts within a round falls on both.
		for _, hang := range [2]bool{round%2 == 1, round%2 == 0} {
			rig.hang(hang)
			testkit.CheckFor(tb, 5*time.Second, 5*time.Millisecond, func() error {
				switch n := rig.inFlight.Load(); {
				case hang && n < hangingPool:
					return fmt.Errorf("%d hanging calls in flight, want %d", n, hangingPool)
				case !hang && n > 2:
					return fmt.Errorf("%d calls still held", n)
				}
				return nil
			})
			if hang {
				hanging = append(hanging, rig.measure(tb, perRound)...)
			} else {
				answering = append(answering, rig.measure(tb, perRound)...)
			}
		}
	}
	return answering, hanging
}

// TestSecondAppLoginsDoNotWait: while one app's login callback hangs (its pool and queue full,
// more logins rejected), another app's logins go on at their usual speed. Under -short it
// checks that they do not wait for the hanging calls (a login held behind them would take up
// to the 1s timeout, or fail); the full run (go test -run TestSecondAppLoginsDoNotWait
// ./callback/) also checks that their p99 is within 20% of their p99 while the callback
// answers (plus a millisecond: the scheduling noise of a shared machine), and logs both.
func TestSecondAppLoginsDoNotWait(t *testing.T) {
	t.Parallel()
	rig := startIsolationRig(t)
	rounds, perRound := 1, 40
	if !testing.Short() {
		rounds, perRound = 20, 100
	}
	answering, hanging := runIsolation(t, rig, rounds, perRound)
	pa, ph := p99(answering), p99(hanging)
	t.Logf("second app's login p99: %v while the other app's callback answers, %v while it hangs (%d logins each)", pa, ph, len(hanging))
	if ph >= hangingTimeout/4 {
		t.Fatalf("second app's login p99 %v while the other app's callback hangs: its logins waited for the hanging calls", ph)
	}
	if !testing.Short() && ph > pa*12/10+time.Millisecond {
		t.Fatalf("second app's login p99 %v while the other app's callback hangs, %v while it answers: more than 20%% slower", ph, pa)
	}
}

// BenchmarkSecondAppLoginP99 reports the second app's login p99 while the other app's callback
// answers and while it hangs, and their ratio (docs/benchmarks.md): b.N times 400 logins each
// way, in blocks of 100.
func BenchmarkSecondAppLoginP99(b *testing.B) {
	rig := startIsolationRig(b)
	var answering, hanging []time.Duration
	for b.Loop() {
		a, h := runIsolation(b, rig, 4, 100)
		answering, hanging = append(answering, a...), append(hanging, h...)
	}
	pa, ph := p99(answering), p99(hanging)
	b.ReportMetric(float64(pa.Microseconds())/1000, "p99-ms-answering")
	b.ReportMetric(float64(ph.Microseconds())/1000, "p99-ms-hanging")
	b.ReportMetric(float64(ph)/float64(pa), "ratio")
	b.ReportMetric(float64(percentile(answering, 50).Microseconds())/1000, "p50-ms-answering")
	b.ReportMetric(float64(percentile(hanging, 50).Microseconds())/1000, "p50-ms-hanging")
}
