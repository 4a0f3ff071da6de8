package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/tools/loadgen"
	"roomcast/sdk"
)

const benchUsage = `Usage: roomcast bench <scenario> [flags]

The load generator. It measures a running deployment from outside, like clients and app
backends use it, and reads the server's CPU and memory from its /metrics (or /proc with --pid).

Scenarios:
  conns    N logged-in idle members; the server's RSS growth per connection
  fanout   N members in one room, R messages/s through the server API; deliveries/s, losses,
           latency, deliveries per server CPU-second
  login    N logins paced at R/s; logins/s and login latency
  upload   N members in one room, K of them sending a message every D themselves (and with
           --likes every member tapping likes); what was accepted, refused, delivered, thinned
           and sampled, bus requests per ChatLink, latency from a member's send to the others'
           receipt, server CPU per upload, like totals against the likes sent
  cdn      a room in CDN mode under R bulk messages/s, N virtual viewers polling its segments
           through a CDN edge (nginx); the pusher's rate, polls per viewer per window, origin
           requests per segment, bytes per viewer against the long link's

Run 'roomcast bench <scenario> --help' for its flags. The defaults fit a local 'roomcast dev'.
`

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchUsage)
		return 2
	}
	scenario, rest := args[0], args[1:]
	// The bench's clients allocate a little for every message they receive, on a small heap:
	// collect less often, so that the load generator leaves the shared cores to the server.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	switch scenario {
	case "conns", "fanout", "login", "cdn", "upload":
	case "worker": // hidden: a worker process of a bigger run, started by the bench itself
		if err := loadgen.ServeWorker(ctx, os.Stdin, stdout, nil); err != nil {
			fmt.Fprintln(stderr, "roomcast bench worker:", err)
			return 1
		}
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, benchUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "roomcast bench: unknown scenario %q\n\n%s", scenario, benchUsage)
		return 2
	}

	fs := flag.NewFlagSet("bench "+scenario, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	fs.StringVar(&cfg.Dispatcher, "dispatcher", "http://127.0.0.1:8080", "dispatcher base URL")
	fs.StringVar(&cfg.API, "api", "", "server API base URL (default: the dispatcher's)")
	fs.StringVar(&cfg.APIKey, "api-key", devcluster.APIKey, "server API key, for the room settings and messages of fanout")
	fs.StringVar(&cfg.Metrics, "metrics", "", "URL of the server's Prometheus metrics (default: <api>/metrics, which roomcast dev serves; roomcast services serves them on its --ops address)")
	fs.Var(&cfg.PIDs, "pid", "read the server's RSS and CPU time from /proc/PID instead of /metrics (a local server); a comma-separated list (a fleet: dev and its ChatLinks) is summed and reported per process")
	fs.Var(&cfg.BenchCPUs, "bench-cpus", "pin the bench and its worker processes to these CPUs (a list like 1 or 2-3,5), so that latency figures are not the bench fighting the server for a core")
	fs.Var(&cfg.ServerCPUs, "server-cpus", "pin the server processes of --pid to these CPUs (every thread, as taskset -a -p does); without --pid start the server under taskset -c instead")
	secret := fs.String("secret", devcluster.Secret, "the app's token secret")
	fs.StringVar(&cfg.App, "app", devcluster.App, "app id")
	fs.StringVar(&cfg.Transport, "transport", sdk.TransportWebSocket, "client transport: ws or tcp")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM file of the CA certificates to trust instead of the system's, for https://, wss:// and TLS TCP (a server started with --tls-cert)")
	fs.BoolVar(&cfg.TLSNoResume, "tls-no-resume", false, "members over TLS never resume a session: every connection is a full handshake (default: they share a session cache and resume)")
	fs.IntVar(&cfg.N, "n", 100, "how many clients")
	fs.StringVar(&cfg.Room, "room", "", "room (default: a fresh room bench-<run id>)")
	fs.IntVar(&cfg.PerProcess, "per-process", loadgen.DefaultPerProcess, "clients per process; more are spread over worker processes")
	fs.IntVar(&cfg.Concurrency, "concurrency", 128, "logins in flight while members join (conns, fanout)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line of stdout")
	cpuProfile := fs.String("cpuprofile", "", "write the bench process's own CPU profile to this file (to check that the load generator stays lean)")
	progress := fs.Bool("progress", false, "print a status line every second on stderr (default: when stderr is a terminal)")
	switch scenario {
	case "conns":
		fs.IntVar(&cfg.Rooms, "rooms", 1, "spread the members over this many rooms")
		fs.DurationVar(&cfg.Settle, "settle", 30*time.Second, "longest wait for the server's RSS to settle")
		fs.DurationVar(&cfg.Hold, "hold", 0, "keep the members connected this long after measuring, e.g. to profile the server")
		fs.StringVar(&cfg.Client, "client", loadgen.ClientSDK, "members' client: sdk or raw (see fanout)")
	case "fanout":
		fs.Float64Var(&cfg.Rate, "rate", 10, "messages per second")
		fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to publish")
		fs.DurationVar(&cfg.Tick, "tick", 0, "the room's flush tick (0: the server's default)")
		fs.DurationVar(&cfg.LatencyBudget, "latency-budget", 0, "the room's latency budget, latency_budget_ms: how long its normal and bulk messages may wait to share a frame (0: the server's default)")
		fs.BoolVar(&cfg.NoMerge, "no-merge", false, "switch merging off for the room: one frame per message")
		fs.StringVar(&cfg.Client, "client", loadgen.ClientSDK, "members' client: sdk (sdk.Client, as apps use it) or raw (the protocol spoken directly: far less bench CPU per delivery, for big runs on a shared machine)")
		fs.IntVar(&cfg.Slow, "slow", 0, "extra members that log in and never read again (a small receive buffer), to show they delay no one")
		fs.BoolVar(&cfg.LiveState, "live-state", false, "raw members ask for the room's live state (viewer counts, member notices, attributes) as the SDKs do, and count those frames (--client raw)")
		fs.Float64Var(&cfg.Churn, "churn", 0, "extra members a second that log in while the bench publishes, each leaving 2 s later, so that the room's viewer count changes every interval (0 to 200)")
		fs.IntVar(&cfg.Tags, "tags", 0, "tag-targeted fanout with this many distinct member tag sets in 10 classes (0: untargeted)")
		fs.StringVar(&cfg.Lane, "lane", "critical", "lane of the messages: critical, normal, bulk or mix (round robin)")
		fs.IntVar(&cfg.Size, "size", 64, "message body size in bytes (24 to 16384)")
		fs.IntVar(&cfg.Senders, "senders", 0, "concurrent HTTP senders (0: rate/5, 16 to 128)")
		fs.IntVar(&cfg.Batch, "batch", 1, "messages per server API request (more than 1: POST /v1/rooms/{room}/messages/batch, at most 100)")
		fs.StringVar(&cfg.APIStream, "api-stream", "", "publish over one SendStream of the server API's gRPC listener at this host:port (roomcast dev: 127.0.0.1:9090) instead of HTTP requests: one send per message on a long-lived stream")
		fs.DurationVar(&cfg.Wait, "wait", 10*time.Second, "longest wait for stragglers after the last message")
		fs.DurationVar(&cfg.Pause, "pause", 3*time.Second, "idle time between the members' joining and the first message, so the logins' aftermath stays out of the figures (negative: none)")
		fs.Float64Var(&cfg.LoginRate, "login-rate", 0, "members' logins per second over all worker processes, paced like an audience arriving (0: --concurrency logins in flight)")
	case "upload":
		fs.IntVar(&cfg.Uploaders, "uploaders", 10, "how many of the members send messages themselves")
		fs.DurationVar(&cfg.Every, "every", 2*time.Second, "each uploader sends one message this often (the uploaders spread evenly over it)")
		fs.Float64Var(&cfg.Likes, "likes", 0, "likes a second every member taps as well (CounterAdds of the room's counter \"like\", spread evenly); the run then checks that every member's total ends equal to the likes taken (0: none)")
		fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to upload")
		fs.DurationVar(&cfg.Tick, "tick", 0, "the room's flush tick (0: the server's default)")
		fs.StringVar(&cfg.Lane, "lane", "bulk", "lane of the uploads: bulk or normal")
		fs.IntVar(&cfg.Size, "size", 64, "message body size in bytes (24 to 16384)")
		fs.DurationVar(&cfg.Wait, "wait", 10*time.Second, "longest wait for answers and stragglers after the last upload")
		fs.DurationVar(&cfg.Pause, "pause", 3*time.Second, "idle time between the members' joining and the first upload (negative: none)")
	case "login":
		fs.Float64Var(&cfg.Rate, "rate", 1000, "logins per second")
		fs.IntVar(&cfg.Rooms, "rooms", 1, "spread the logins over this many rooms")
		fs.StringVar(&cfg.Client, "client", loadgen.ClientSDK, "members' client: sdk or raw (see fanout)")
	case "cdn":
		fs.Float64Var(&cfg.Rate, "rate", 1000, "bulk messages per second")
		fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to publish; the viewers poll its whole windows")
		fs.IntVar(&cfg.Size, "size", 64, "message body size in bytes (24 to 16384), padded with random letters")
		fs.IntVar(&cfg.Batch, "batch", 0, "messages per server API request (0: rate/50, at most 100)")
		fs.IntVar(&cfg.Conns, "conns", 128, "keep-alive connections the virtual viewers share")
		fs.StringVar(&cfg.Edge, "edge", "", "base URL of a CDN edge in front of the room's origin (default: run nginx in front of it and count the origin's requests)")
		fs.IntVar(&cfg.EdgeWorkers, "edge-workers", 1, "worker processes of the bench's nginx")
	}
	fs.Usage = func() {
		fmt.Fprint(stderr, benchScenarioUsage[scenario])
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, rest); code >= 0 {
		return code
	}
	cfg.Secret = []byte(*secret)
	terminal := isTerminal(stderr)
	// Status lines and the worker processes' stderr arrive from several goroutines.
	stderr = loadgen.SyncWriter(stderr)
	cfg.WorkerStderr = stderr
	if *progress || terminal {
		cfg.Progress = progressLine(stderr, terminal)
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "roomcast bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "roomcast bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	var (
		res  interface{ String() string }
		ok   bool
		err  error
		code = 0
	)
	switch scenario {
	case "conns":
		var r loadgen.ConnsResult
		r, err = loadgen.RunConns(ctx, cfg)
		res, ok = r, r.OK()
	case "fanout":
		var r loadgen.FanoutResult
		r, err = loadgen.RunFanout(ctx, cfg)
		res, ok = r, r.OK()
	case "login":
		var r loadgen.LoginResult
		r, err = loadgen.RunLogin(ctx, cfg)
		res, ok = r, r.Passed()
	case "cdn":
		var r loadgen.CDNResult
		r, err = loadgen.RunCDN(ctx, cfg)
		res, ok = r, r.OK()
	case "upload":
		var r loadgen.UploadResult
		r, err = loadgen.RunUpload(ctx, cfg)
		res, ok = r, r.OK()
	}
	if cfg.Progress != nil && terminal {
		fmt.Fprint(stderr, "\r\033[K") // clear the status line
	}
	if err != nil {
		fmt.Fprintln(stderr, "roomcast", err) // err reads "bench: ..."
		code = 1
	}
	if err == nil || *asJSON {
		fmt.Fprintln(stdout, res)
	}
	if err == nil && !ok {
		fmt.Fprintf(stderr, "roomcast bench %s: failed (see the summary)\n", scenario)
		code = 1
	}
	if *asJSON {
		line, jerr := resultJSON(res, err)
		if jerr != nil {
			fmt.Fprintln(stderr, "roomcast bench:", jerr)
			return 1
		}
		fmt.Fprintln(stdout, line)
	}
	return code
}

// resultJSON is res as one line of JSON, with an "error" field when the run failed.
func resultJSON(res any, runErr error) (string, error) {
	b, err := json.Marshal(res)
	if err != nil || runErr == nil {
		return string(b), err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	m["error"] = runErr.Error()
	b, err = json.Marshal(m)
	return string(b), err
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine writes status lines to w: rewriting one line on a terminal, one per line
// otherwise.
func progressLine(w io.Writer, terminal bool) func(string) {
	start := time.Now()
	return func(line string) {
		line = fmt.Sprintf("%5.0fs %s", time.Since(start).Seconds(), line)
		if terminal {
			fmt.Fprint(w, "\r\033[K"+line)
			return
		}
		fmt.Fprintln(w, line)
	}
}

var benchScenarioUsage = map[string]string{
	"conns": `Usage: roomcast bench conns [--n N] [--rooms K] [--hold D] [target flags]

Logs N members in (one room, or spread over K rooms) and leaves them idle. It reads the
server's process_resident_memory_bytes before connecting and again once the connections have
settled (at least 3s after the last login, then until RSS is stable within 1% or --settle has
passed), and reports rss_per_conn_bytes = (after - before) / connected. --hold D keeps the
members connected for D after that, to profile the server in that state. To measure one
ChatLink of its own, give its --pid (RSS and CPU from /proc) and its ops /metrics (--metrics).

Exit status: 0 when every client logged in and stayed connected, 1 otherwise, 2 for bad flags.

`,
	"fanout": `Usage: roomcast bench fanout [--n N] [--rate R] [--duration D] [--tick T] [--no-merge]
                            [--latency-budget L]
                            [--tags G] [--lane critical|normal|bulk|mix] [--size B] [--batch K]
                            [--slow K] [--client sdk|raw] [target flags]

Puts N members in one fresh room, sets the room's flush tick, latency budget and merging and lifts its
per-member budgets and its bulk cap (POST/PATCH /v1/rooms settings with normal_budget,
critical_budget and bulk_per_second -1),
lets the members sit idle for --pause (3s), then publishes R messages per second for D through
the server API (POST
/v1/rooms/{room}/messages, several senders on keep-alive connections). Each body carries its
send time and sequence number; latency is receipt minus send time. After the last message it
waits up to --wait for stragglers, and reports deliveries/s, expected vs delivered per lane,
lost_critical, p50/p99/max latency, and deliveries per server CPU-second (the server's
process_cpu_seconds_total over the run).

--tags G makes the run tag-targeted: member i logs in with the tags g:<i mod G> and
c:<(i mod G) mod 10> (G distinct tag sets in 10 classes), and message s carries a tag_expr
chosen from s alone, alternating between one class ("c:3" in tags) and two classes plus one
group ("c:1" in tags || "c:4" in tags || "g:17" in tags). Expected deliveries count only the
audience of each message; a receipt outside it is counted as leaked.

--slow K adds K members that log in over a raw connection with a 4 KiB receive buffer and then
never read; they count in no delivery figure, and the server's slow-reader closes over the run
are reported (server_slow_reader_closes). Compare the others' p99 with and without them.

--live-state has the raw members ask for the room's live state as the SDKs do (viewer counts,
member notices, attributes; docs/protocol.md) and count those frames (live_frames). --churn C
logs C extra members a second into the room while the bench publishes, each leaving 2 s later,
so that the room's count changes every viewer interval: the viewer counts' worst case (a count
that holds still sends nothing). The churning members count in no delivery figure. Compare
deliveries per server CPU-second with and without --live-state, both with the same --churn.

--client raw makes the members speak the protocol directly instead of through the SDK: the
same deliveries for far less of the bench's CPU, for big runs on a machine the bench shares
with the server. --pid reads the server's CPU and RSS from /proc (say, a ChatLink of its own),
and --metrics names the /metrics to read the delivery counters from.

Exit status: 0 when every member joined, every message was accepted, no critical message
was lost and none leaked; 1 otherwise; 2 for bad flags.

`,
	"upload": `Usage: roomcast bench upload [--n N] [--uploaders K] [--every D] [--likes L] [--duration T]
                           [--tick T] [--lane bulk|normal] [--size B] [target flags]

Puts N raw members (the protocol spoken directly) in one fresh room with the server's default
settings (budgets, bulk cap) and the flush tick --tick, lets them sit idle for --pause (3s), then
has the first K of them send one message each every D for T (K/D messages a second, spread
evenly), as viewers writing danmaku do. Each body carries its send time and sequence number.
After the last upload it waits for every answer and for the deliveries to stop (within --wait),
and reports: sends accepted (SendAck), refused (Error, by code) and unanswered; the send
requests the room service answered over the run (roomcast_room_requests_total{op="send"}, so
run it against a server with no other traffic) per ChatLink of the room and second; the bulk
messages the room's cap sampled out; deliveries against expected (every accepted message to
every other member), what the members' Pushes reported as thinned, and what is neither
(unaccounted); latency from a member's send to the other members' receipt; and the server's CPU
per uploaded message (the whole server: give --pid for a dev's process). The members run in
this process (at most --per-process).

With --likes L every member also taps the room's counter "like" L times a second (CounterAdds,
spread evenly over the members; docs/protocol.md, "Counters"), and the run reports the likes
sent and refused, how many members' last totals equal the likes taken (every member's, in a
clean run: none lost, none counted twice), the counter windows the room service answered
(roomcast_room_counter_windows_total) per ChatLink and second, and the totals frames a member
received a second. The server CPU per uploaded message then includes the likes' work.

Exit status: 0 when every member joined, every send was answered, nothing was lost
unaccounted and (with --likes) every member's like total is the likes taken; 1 otherwise; 2
for bad flags.

`,
	"login": `Usage: roomcast bench login [--n N] [--rate R] [--rooms K] [target flags]

Starts N logins paced at R per second, each a dispatch, a connection and a login answered by
its LoginAck, and reports logins/s achieved and p50/p99/max login latency; then closes them.

Exit status: 0 when every login succeeded, 1 otherwise, 2 for bad flags.

`,
	"cdn": `Usage: roomcast bench cdn [--n VIEWERS] [--rate R] [--duration D] [--size B] [--conns C]
                        [--edge URL] [--edge-workers W] [target flags]

Pins a fresh room to CDN_MODE_BULK (PUT /v1/rooms/{room}/cdn; the deployment needs a CDN
pusher, as 'roomcast dev' runs), starts Debian's nginx as a CDN edge (proxy_cache with
proxy_cache_lock, as the CDN tests run it) in front of the room's origin, behind it a proxy that
counts the requests reaching the origin, and publishes R bulk messages a second for D through
the server API. N virtual viewers (cheap HTTP pollers over C shared keep-alive connections,
pipelined; not SDK clients) poll every whole window of the run through the edge, each when the
SDK would: the window's end, the pusher's grace and a tenth of a window, plus a random jitter
below the room's poll_jitter_ms; a 404 is polled again a fifth of a window later.

It reports the pusher's aggregation (messages/s, sampled, segments and bytes, from the server's
/metrics), polls per viewer per window, origin requests per segment, how late segments reached
viewers, and the bytes each viewer received per second against what Push frames of the same
messages would cost over the long link (100 ms frames, WebSocket framing). With --edge URL the
viewers poll that edge instead, and origin requests are not counted.

Exit status: 0 when every viewer got every window's segment, every message was accepted and no
segment cost the origin more than 2 requests; 1 otherwise; 2 for bad flags.

`,
}
