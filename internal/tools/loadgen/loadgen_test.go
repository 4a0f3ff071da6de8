package loadgen_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/internal/tools/loadgen"
	"roomcast/sdk"
)

// workerFlag makes the test binary act as a bench worker process, so that tests run the real
// multi-process path.
const workerFlag = "-loadgen.worker"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == workerFlag {
		if err := loadgen.ServeWorker(context.Background(), os.Stdin, os.Stdout, nil); err != nil {
			os.Stderr.WriteString("bench worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == sleeperFlag {
		time.Sleep(30 * time.Second) // a stand-in server process: a Go program's several threads
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	return testcluster.Start(t, testcluster.ChatLinks(1))
}

// config is a bench against c with n members; fan-outs pause 100 ms after the joins, not the
// default 3 s (the command's tests run with the default).
func config(c *devcluster.Cluster, n int) loadgen.Config {
	return loadgen.Config{
		Dispatcher: c.URL(), APIKey: devcluster.APIKey, App: devcluster.App, Secret: []byte(devcluster.Secret), N: n,
		Pause: 100 * time.Millisecond,
	}
}

// publishFor is how long a fan-out test publishes: 2s, or 500ms under -short (`make test`);
// what the tests expect scales with it.
func publishFor() time.Duration {
	if testing.Short() {
		return 500 * time.Millisecond
	}
	return 2 * time.Second
}

// settleFor bounds the conns tests' wait for the server's RSS to settle: 5s, or under -short
// 3s, the least RunConns waits anyway.
func settleFor() time.Duration {
	if testing.Short() {
		return 3 * time.Second
	}
	return 5 * time.Second
}

// oneLoad is held by each fan-out test while it runs: the tests run in parallel with the rest,
// but not with each other, since each counts every delivery and two loads on a shared machine
// starve each other's members.
var oneLoad sync.Mutex

// jsonFields returns v as a JSON object.
func jsonFields(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func requireFields(t *testing.T, m map[string]any, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, ok := m[n]; !ok {
			t.Errorf("JSON lacks %q: %v", n, m)
		}
	}
}

func TestConns(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	cfg := config(c, 20)
	cfg.Rooms = 3
	cfg.Settle = settleFor()
	res, err := loadgen.RunConns(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if !res.OK() || res.Connected != 20 || res.Workers != 1 {
		t.Errorf("conns on a healthy cluster: %+v", res)
	}
	if res.RSSBeforeBytes <= 0 || res.RSSAfterBytes <= 0 {
		t.Errorf("RSS not read from /metrics: before %v after %v", res.RSSBeforeBytes, res.RSSAfterBytes)
	}
	if res.ServerConnections != 20 {
		t.Errorf("server counts %v connections, want 20", res.ServerConnections)
	}
	if res.BenchCPUSeconds <= 0 || res.BenchMaxRSSBytes <= 0 {
		t.Errorf("bench usage %v CPU-s, %v bytes", res.BenchCPUSeconds, res.BenchMaxRSSBytes)
	}
	m := jsonFields(t, res)
	requireFields(t, m, "scenario", "n", "rss_per_conn_bytes")
	if m["scenario"] != "conns" || m["n"] != float64(20) {
		t.Errorf("JSON %v", m)
	}
}

func TestConnsPID(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	cfg := config(c, 5)
	cfg.PIDs = loadgen.PIDList{os.Getpid()} // the cluster runs in this process
	cfg.Settle = settleFor() - time.Second
	res, err := loadgen.RunConns(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.RSSBeforeBytes <= 0 || res.RSSAfterBytes <= 0 || !res.OK() {
		t.Errorf("conns with --pid: %+v", res)
	}
}

func TestFanout(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	published := int64(20 * publishFor().Seconds())
	for _, tc := range []struct {
		name      string
		transport string
		lane      string
		noMerge   bool
		batch     int
		client    string
		slow      int
		stream    bool // published over the API's SendStream
	}{
		{"ws critical merged", sdk.TransportWebSocket, "critical", false, 1, "", 0, false},
		{"tcp mix no-merge", sdk.TransportTCP, "mix", true, 1, "", 0, false},
		{"ws mix batches of 7", sdk.TransportWebSocket, "mix", false, 7, "", 0, false},
		{"raw ws clients and a slow member", sdk.TransportWebSocket, "mix", false, 1, loadgen.ClientRaw, 1, false},
		{"raw tcp clients and a slow member", sdk.TransportTCP, "critical", true, 1, loadgen.ClientRaw, 1, false},
		{"raw tcp clients, mix over a send stream", sdk.TransportTCP, "mix", false, 1, loadgen.ClientRaw, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(c, 20)
			cfg.Transport, cfg.Lane, cfg.NoMerge, cfg.Batch = tc.transport, tc.lane, tc.noMerge, tc.batch
			cfg.Client, cfg.Slow = tc.client, tc.slow
			if tc.stream {
				cfg.APIStream = c.GRPCAddr()
			}
			cfg.Rate, cfg.Duration, cfg.Tick = 20, publishFor(), 50*time.Millisecond
			var lines int
			cfg.Progress = func(string) { lines++ }
			res, err := loadgen.RunFanout(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if !res.OK() {
				t.Errorf("fanout on a healthy cluster is not OK: %+v", res)
			}
			if res.Published != published || res.Expected != published*20 || res.Delivered != res.Expected || res.Lost != 0 || res.Dup != 0 {
				t.Errorf("published %d, expected %d, delivered %d, lost %d, dup %d; want %d, %d, %[7]d, 0, 0",
					res.Published, res.Expected, res.Delivered, res.Lost, res.Dup, published, published*20)
			}
			if res.DeliveredByLane.Critical != res.ExpectedByLane.Critical || res.LostCritical != 0 {
				t.Errorf("critical: %d of %d delivered", res.DeliveredByLane.Critical, res.ExpectedByLane.Critical)
			}
			if tc.lane == "mix" && (res.ExpectedByLane.Normal == 0 || res.ExpectedByLane.Bulk == 0 || res.ExpectedByLane.Critical == 0) {
				t.Errorf("mix did not use every lane: %+v", res.ExpectedByLane)
			}
			if res.ServerCPUSeconds <= 0 || res.DeliveriesPerServerCPUSec <= 0 || res.DeliveriesPerSec <= 0 {
				t.Errorf("rates: cpu %v, per cpu-s %v, per s %v", res.ServerCPUSeconds, res.DeliveriesPerServerCPUSec, res.DeliveriesPerSec)
			}
			if res.Slow != tc.slow {
				t.Errorf("%d slow members, want %d", res.Slow, tc.slow)
			}
			if res.ServerDeliveries < float64(res.Delivered) {
				t.Errorf("server counted %v deliveries, the bench received %d", res.ServerDeliveries, res.Delivered)
			}
			if res.P50MS <= 0 || res.P99MS < res.P50MS || res.MaxMS < res.P99MS {
				t.Errorf("latencies p50 %v p99 %v max %v", res.P50MS, res.P99MS, res.MaxMS)
			}
			if lines == 0 {
				t.Errorf("no progress line in a %v run", publishFor())
			}
			m := jsonFields(t, res)
			requireFields(t, m, "scenario", "n", "deliveries_per_sec", "deliveries_per_server_cpu_sec", "expected",
				"delivered", "lost_critical", "p50_ms", "p99_ms", "max_ms")
		})
	}
}

// TestFanoutWorkers runs the members in three worker processes (this test binary, acting as
// `roomcast bench worker`), which report to this one.
func TestFanoutWorkers(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	cfg := config(c, 20)
	cfg.PerProcess = 8
	cfg.WorkerCommand = []string{os.Args[0], workerFlag}
	cfg.WorkerStderr = os.Stderr
	cfg.Rate, cfg.Duration, cfg.Tick = 20, time.Second, 50*time.Millisecond
	res, err := loadgen.RunFanout(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Workers != 3 || !res.OK() || res.Delivered != res.Expected || res.Expected != 20*20 {
		t.Errorf("fanout over 3 workers: %+v", res)
	}
	if res.P99MS <= 0 {
		t.Errorf("no latencies from the workers: %+v", res)
	}
}

// TestFanoutTags runs a tag-targeted fanout, in this process and over three worker
// processes: every member gets exactly the messages its tags allow and nothing else.
func TestFanoutTags(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	msgs := int(40 * publishFor().Seconds())
	for _, tc := range []struct {
		name       string
		perProcess int
		lane       string
	}{
		{"one process", 0, "critical"},
		{"three workers", 15, "mix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, groups = 40, 8
			cfg := config(c, n)
			cfg.Tags, cfg.Lane = groups, tc.lane
			cfg.Rate, cfg.Duration, cfg.Tick = 40, publishFor(), 50*time.Millisecond
			if tc.perProcess > 0 {
				cfg.PerProcess = tc.perProcess
				cfg.WorkerCommand = []string{os.Args[0], workerFlag}
				cfg.WorkerStderr = os.Stderr
			}
			res, err := loadgen.RunFanout(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			// 40 members in 8 groups of 5; group g is in class g. Even messages go to one
			// class (5 members, or none for classes 8 and 9), odd ones to two classes and a
			// group: between 0 and 15 members. The exact figure is worked out independently
			// here from the scheme.
			var want int64
			for seq := range msgs {
				k := seq / 2 % 10
				inClass := func(k int) int64 {
					if k < groups {
						return 5
					}
					return 0
				}
				if seq%2 == 0 {
					want += inClass(k)
					continue
				}
				k2 := (k + 1 + seq/20%9) % 10
				h := seq / 2 * 7919 % groups
				want += inClass(k) + inClass(k2)
				if h != k && h != k2 {
					want += 5
				}
			}
			if !res.OK() || res.Tags != groups || res.Published != int64(msgs) || res.Connected != n {
				t.Errorf("targeted fanout on a healthy cluster: %+v", res)
			}
			if res.Expected != want || res.Delivered != res.Expected || res.Lost != 0 || res.Leaked != 0 || res.Dup != 0 ||
				res.IncompleteMembers != 0 {
				t.Errorf("expected %d (want %d), delivered %d, lost %d, leaked %d, dup %d, incomplete %d",
					res.Expected, want, res.Delivered, res.Lost, res.Leaked, res.Dup, res.IncompleteMembers)
			}
			if res.Expected >= int64(msgs*n/2) || res.MeanAudience <= 0 || res.MeanAudience >= n {
				t.Errorf("expected %d deliveries, mean audience %v: not targeted", res.Expected, res.MeanAudience)
			}
			if res.ServerDeliveries != float64(res.Delivered) {
				t.Errorf("the server counted %v deliveries, the bench %d", res.ServerDeliveries, res.Delivered)
			}
			requireFields(t, jsonFields(t, res), "tags", "leaked", "mean_audience", "expected", "delivered", "lost", "dup")
		})
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	cfg := config(c, 50)
	cfg.Rate = 200
	res, err := loadgen.RunLogin(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if !res.Passed() || res.OK != 50 {
		t.Errorf("login on a healthy cluster: %+v", res)
	}
	if res.LoginsPerSec <= 0 || res.LoginsPerSec > 400 {
		t.Errorf("%v logins/s paced at 200/s", res.LoginsPerSec)
	}
	if res.P50MS <= 0 || res.P99MS < res.P50MS || res.MaxMS < res.P99MS {
		t.Errorf("latencies p50 %v p99 %v max %v", res.P50MS, res.P99MS, res.MaxMS)
	}
	requireFields(t, jsonFields(t, res), "scenario", "n", "logins_per_sec", "p99_ms")
}

func TestLoginBadSecret(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	cfg := config(c, 3)
	cfg.Secret = []byte("wrong")
	cfg.Rate = 100
	res, err := loadgen.RunLogin(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed() || res.Failed != 3 || len(res.Errors) == 0 {
		t.Errorf("logins with a wrong secret: %+v", res)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ok := loadgen.Config{Dispatcher: "http://127.0.0.1:1", APIKey: "k", Secret: []byte("s"), N: 1, Rate: 1}
	for _, tc := range []struct {
		name string
		edit func(*loadgen.Config)
		want error
	}{
		{"negative tags", func(c *loadgen.Config) { c.Tags = -1 }, nil},
		{"no rate", func(c *loadgen.Config) { c.Rate = 0 }, nil},
		{"no key", func(c *loadgen.Config) { c.APIKey = "" }, nil},
		{"bad lane", func(c *loadgen.Config) { c.Lane = "urgent" }, nil},
		{"tiny size", func(c *loadgen.Config) { c.Size = 8 }, nil},
		{"huge size", func(c *loadgen.Config) { c.Size = 20000 }, nil},
		{"no n", func(c *loadgen.Config) { c.N = 0 }, nil},
		{"no secret", func(c *loadgen.Config) { c.Secret = nil }, nil},
		{"bad transport", func(c *loadgen.Config) { c.Transport = "udp" }, nil},
		{"bad client", func(c *loadgen.Config) { c.Client = "curl" }, nil},
		{"negative slow", func(c *loadgen.Config) { c.Slow = -1 }, nil},
		{"live state from the SDK", func(c *loadgen.Config) { c.LiveState = true }, nil},
		{"negative churn", func(c *loadgen.Config) { c.Churn = -1 }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			_, err := loadgen.RunFanout(context.Background(), cfg)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("RunFanout = %v, want an error (%v)", err, tc.want)
			}
		})
	}
}

// sleeperFlag makes the test binary a process that only sleeps, for pinning.
const sleeperFlag = "-loadgen-sleeper"

// TestFanoutThroughJoinLimit: members logging in faster than the node's join rate for their
// room are refused with Kick 4013; the bench's clients, the SDK's and the raw ones, wait the
// server's hint and try again, so every member logs in and gets every message.
func TestFanoutThroughJoinLimit(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.Limits.JoinsPerRoom = ratelimit.Limit{Rate: 40, Burst: 5}
	})
	for _, client := range []string{loadgen.ClientSDK, loadgen.ClientRaw} {
		t.Run(client, func(t *testing.T) {
			const n = 30
			cfg := config(c, n)
			cfg.Client, cfg.Room = client, "limited-"+client
			cfg.Rate, cfg.Duration, cfg.Tick = 20, publishFor(), 50*time.Millisecond
			res, err := loadgen.RunFanout(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if res.Connected != n || res.Failed != 0 || res.Limited == 0 {
				t.Errorf("connected %d, failed %d, limited %d: want %d, 0 and some", res.Connected, res.Failed, res.Limited, n)
			}
			if res.Delivered != res.Expected || res.Lost != 0 {
				t.Errorf("delivered %d of %d, lost %d", res.Delivered, res.Expected, res.Lost)
			}
		})
	}
}

// TestRawMembersBeatAtTheServersInterval: raw members heartbeat at the interval the server
// gives them, as the SDK's clients do, so a server that asks for beats every 400 ms keeps them
// all through a run several times longer than three intervals (its limit for a silent member;
// shorter intervals made a race-built run on a loaded machine miss one now and then).
func TestRawMembersBeatAtTheServersInterval(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	const interval = 400 * time.Millisecond
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.ChatLink.HeartbeatInterval, cfg.ChatLink.HeartbeatMax = interval, interval
	})
	const n = 20
	cfg := config(c, n)
	cfg.Client, cfg.Pause = loadgen.ClientRaw, 5*interval
	cfg.Rate, cfg.Duration, cfg.Tick = 20, publishFor(), 50*time.Millisecond
	res, err := loadgen.RunFanout(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Connected != n || res.Disconnected != 0 || res.Delivered != res.Expected || res.Lost != 0 {
		t.Errorf("connected %d, disconnected %d, delivered %d of %d, lost %d: want %d, 0, all, 0",
			res.Connected, res.Disconnected, res.Delivered, res.Expected, res.Lost, n)
	}
}

// Members' own sends: every send answered and accepted, each delivered to every other member
// or counted in the Pushes as thinned (the room's default budget, 20 a second, is below the 200
// sent), the room service's send requests counted, and the bus carrying fewer requests than
// sends (the ChatLink's windows). The uploaders' sends are spread evenly, one every 5 ms, so a
// 20 ms window gathers several even on an idle machine (at one every 25 ms, as before, each
// window held one send and the test passed only when a loaded machine bunched them).
func TestUpload(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	cfg := config(c, 20)
	cfg.Uploaders, cfg.Every, cfg.Duration, cfg.Lane = 20, 100*time.Millisecond, publishFor(), "normal"
	res, err := loadgen.RunUpload(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if !res.OK() || res.Accepted != res.Sent || res.Nodes != 1 {
		t.Errorf("upload on a healthy cluster: %+v", res)
	}
	if want := res.Accepted * 19; res.Expected != want || res.Delivered+res.Thinned < want {
		t.Errorf("delivered %d and thinned %d of %d expected, want all accounted for", res.Delivered, res.Thinned, want)
	}
	if res.RoomSendRequests <= 0 || res.RoomSendRequests >= float64(res.Sent) {
		t.Errorf("%v send requests for %d sends: want some, and fewer than the sends", res.RoomSendRequests, res.Sent)
	}
	requireFields(t, jsonFields(t, res), "sent", "accepted", "refused", "unanswered", "room_send_requests_per_node_sec",
		"sampled", "thinned", "unaccounted", "p99_ms", "server_cpu_us_per_upload")
}

// Likes with the uploads (--likes): every member taps twice a second; every member ends with
// the room's like total equal to the likes sent (none refused), and the likes reach the room
// service as counter windows, far fewer than the taps.
func TestUploadLikes(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	cfg := config(c, 20)
	cfg.Uploaders, cfg.Every, cfg.Duration, cfg.Lane, cfg.Likes = 2, 500*time.Millisecond, publishFor(), "bulk", 2
	res, err := loadgen.RunUpload(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if !res.OK() || res.LikesRefused != 0 || res.LikeTotalExact != 20 || res.LikeTotalMin != res.LikesSent {
		t.Errorf("likes on a healthy cluster: %+v", res)
	}
	if want := int64(20 * 2 * cfg.Duration.Seconds()); res.LikesSent != want {
		t.Errorf("%d likes sent, want %d", res.LikesSent, want)
	}
	if res.CounterWindows <= 0 || res.CounterWindows >= float64(res.LikesSent) {
		t.Errorf("%v counter windows for %d likes: want some, and fewer than the likes", res.CounterWindows, res.LikesSent)
	}
	requireFields(t, jsonFields(t, res), "likes_sent", "like_total_exact", "counter_windows_per_node_sec", "counter_frames_per_member_sec")
}

// TestFanoutLiveState: raw members that ask for the live state (--live-state) get the room's
// viewer count, at least once each at login, while members come and go (--churn); the churning
// members count in no delivery figure; members that do not ask get no live state frame.
func TestFanoutLiveState(t *testing.T) {
	t.Parallel()
	oneLoad.Lock()
	defer oneLoad.Unlock()
	c := startCluster(t)
	for _, live := range []bool{true, false} {
		cfg := config(c, 20)
		cfg.Client, cfg.LiveState, cfg.Churn = loadgen.ClientRaw, live, 20
		cfg.Rate, cfg.Duration, cfg.Tick = 20, publishFor(), 50*time.Millisecond
		res, err := loadgen.RunFanout(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if !res.OK() || res.Delivered != res.Expected || res.Dup != 0 {
			t.Errorf("live state %v: %+v", live, res)
		}
		if res.ChurnLogins == 0 || res.ChurnFailed != 0 {
			t.Errorf("live state %v: %d churning members logged in, %d failed (%v): want some, none failed", live, res.ChurnLogins, res.ChurnFailed, res.Errors)
		}
		switch {
		case live && res.LiveFrames < 20:
			t.Errorf("%d live state frames for 20 members that asked: want one each at least", res.LiveFrames)
		case !live && res.LiveFrames != 0:
			t.Errorf("%d live state frames for members that did not ask", res.LiveFrames)
		}
		requireFields(t, jsonFields(t, res), "live_state", "live_frames", "live_frames_per_member_min", "churn", "churn_logins")
	}
}
