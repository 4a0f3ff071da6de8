// Package probe is an end-to-end check of a running Roomcast deployment, behind `roomcast
// probe`: a few clients join one room through the dispatcher (spread over the nodes it offers),
// each sends a few messages, and the probe verifies that every other client received each
// message exactly once, that no sender got its own message back, and how long delivery took.
//
// It uses only the public surface a real client uses (the dispatcher, the wire protocol through
// package sdk, and tokens minted with the app secret); it must not reach into servers. It is a
// tool, not part of the client SDK: only cmd/roomcast uses it.
package probe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"roomcast/internal/auth"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// Config says where to probe and how hard.
type Config struct {
	// Dispatcher is the dispatcher's base URL, e.g. "http://127.0.0.1:8080". Required.
	Dispatcher string
	// Secret is the app's token secret, used to mint the clients' tokens. Required.
	Secret []byte
	// App is the app id the tokens name. Zero value means "demo".
	App string
	// Room is the room the clients join. Zero value means "r1".
	Room string
	// Clients is how many clients join; at least 2. Zero value means 4.
	Clients int
	// Messages is how many messages each client sends. Zero value means 10.
	Messages int
	// Transport is sdk.TransportWebSocket or sdk.TransportTCP. Zero value means WebSocket.
	Transport string
	// Lane is the lane the messages go on. Zero value means LANE_CRITICAL, which flow control
	// never drops, so that any loss is a fault rather than policy.
	Lane clientpb.Lane
	// Timeout bounds the whole run: joining, sending and waiting for delivery. Zero value
	// means 15s.
	Timeout time.Duration
	// Settle is how long the probe keeps listening after the last expected delivery, to catch
	// duplicates and echoes. Zero value means 200ms.
	Settle time.Duration
	// Logger receives the clients' logs. Nil means none.
	Logger *slog.Logger
}

// withDefaults returns c with the zero values replaced by the documented defaults, or an error
// for a Config Run cannot use.
func (c Config) withDefaults() (Config, error) {
	if c.App == "" {
		c.App = "demo"
	}
	if c.Room == "" {
		c.Room = "r1"
	}
	if c.Clients == 0 {
		c.Clients = 4
	}
	if c.Messages == 0 {
		c.Messages = 10
	}
	if c.Transport == "" {
		c.Transport = sdk.TransportWebSocket
	}
	if c.Lane == clientpb.Lane_LANE_UNSPECIFIED {
		c.Lane = clientpb.Lane_LANE_CRITICAL
	}
	if c.Timeout <= 0 {
		c.Timeout = 15 * time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 200 * time.Millisecond
	}
	switch {
	case c.Dispatcher == "":
		return c, errors.New("probe: no dispatcher URL")
	case len(c.Secret) == 0:
		return c, errors.New("probe: no secret")
	case c.Clients < 2:
		return c, fmt.Errorf("probe: need at least 2 clients, got %d", c.Clients)
	case c.Messages < 1:
		return c, fmt.Errorf("probe: need at least 1 message per client, got %d", c.Messages)
	case c.Transport != sdk.TransportWebSocket && c.Transport != sdk.TransportTCP:
		return c, fmt.Errorf("probe: unknown transport %q", c.Transport)
	}
	return c, nil
}

// Result is what a probe run saw.
type Result struct {
	// Clients is how many clients logged in; Nodes how many distinct ChatLinks they landed on.
	Clients, Nodes int
	// Sent is how many Sends were attempted, Acked how many got a SendAck.
	Sent, Acked int
	// Expected is every message times every client but its sender; Delivered counts distinct
	// (receiver, message) pairs that arrived.
	Expected, Delivered int
	// Lost is Expected - Delivered. Dup counts repeated deliveries, Echo messages a sender
	// received back.
	Lost, Dup, Echo int
	// Disconnected counts clients whose connection ended before the probe closed them.
	Disconnected int
	// P50, P99 and Max are send-to-receive latencies of the delivered messages.
	P50, P99, Max time.Duration
	// Errors holds the first few errors seen (failed sends, disconnects), for the report.
	Errors []string
}

// maxErrors bounds Result.Errors.
const maxErrors = 5

// OK reports whether the run was clean: every client joined, every send was acked, every
// message arrived once at every other client and none came back to its sender.
func (r Result) OK() bool {
	return r.Clients > 0 && r.Acked == r.Sent && r.Sent > 0 && r.Lost == 0 && r.Dup == 0 &&
		r.Echo == 0 && r.Disconnected == 0 && r.Delivered == r.Expected
}

// String is the one-line summary `roomcast probe` prints.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "probe: clients=%d nodes=%d delivered=%d/%d lost=%d dup=%d echo=%d acked=%d/%d",
		r.Clients, r.Nodes, r.Delivered, r.Expected, r.Lost, r.Dup, r.Echo, r.Acked, r.Sent)
	if r.Disconnected > 0 {
		fmt.Fprintf(&b, " disconnected=%d", r.Disconnected)
	}
	fmt.Fprintf(&b, " p50=%s p99=%s max=%s", ms(r.P50), ms(r.P99), ms(r.Max))
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// body is what each probe message carries.
type body struct {
	Run  string `json:"run"`  // this probe run, to ignore other traffic in the room
	From int    `json:"from"` // the sender's index
	Seq  int    `json:"seq"`  // the sender's message number
	Sent int64  `json:"sent"` // send time, unix nanoseconds
}

// Run performs one probe. The Result is filled in as far as the run got, also when the error is
// not nil; the error reports only what kept the probe from running (a bad Config, clients that
// could not join), while faults the probe found are in the Result (see Result.OK).
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	var idb [4]byte
	_, _ = rand.Read(idb[:])
	run := hex.EncodeToString(idb[:])
	rec := newRecorder(run, cfg.Clients)

	// Everyone joins before anyone sends: a member misses what was sent before it joined.
	clients := make([]*sdk.Client, cfg.Clients)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	errs := make([]error, cfg.Clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			uid := fmt.Sprintf("probe-%s-%d", run, i)
			var lanes []auth.MintOption
			if cfg.Lane == clientpb.Lane_LANE_CRITICAL { // members send critical messages only when their token says so
				lanes = append(lanes, auth.WithLanes(auth.LaneCritical))
			}
			tok, err := auth.Mint(cfg.Secret, cfg.App, uid, cfg.Room, nil, cfg.Timeout+time.Minute, lanes...)
			if err != nil {
				errs[i] = fmt.Errorf("mint token for %s: %w", uid, err)
				return
			}
			// Client i tries the dispatcher's list from its i-th node on: the dispatcher puts a
			// room's members together (room affinity), and the probe wants its clients on every
			// node it offers, to check delivery across nodes.
			eps, err := sdk.Dispatch(ctx, http.DefaultClient, cfg.Dispatcher, tok)
			if err != nil {
				errs[i] = err
				return
			}
			eps = append(eps[i%len(eps):], eps[:i%len(eps)]...)
			clients[i], errs[i] = sdk.Dial(ctx, sdk.Config{
				Token:     tok,
				Endpoints: eps,
				Transport: cfg.Transport,
				Device:    "probe",
				// A dropped client and a duplicate are findings, not something to hide.
				NoReconnect:  true,
				DedupeWindow: -1,
				OnMessage:    func(m *clientpb.Message) { rec.receive(i, m) },
				Logger:       cfg.Logger,
			})
		})
	}
	wg.Wait()
	res := Result{Expected: cfg.Clients * (cfg.Clients - 1) * cfg.Messages}
	nodes := map[string]bool{}
	for _, c := range clients {
		if c != nil {
			res.Clients++
			nodes[c.LoginAck().GetNode()] = true
		}
	}
	res.Nodes = len(nodes)
	if failed := cfg.Clients - res.Clients; failed > 0 {
		rec.fill(&res)
		// Usually all fail for one reason (a wrong secret, no dispatcher): show one.
		var first error
		for _, err := range errs {
			if err != nil {
				first = err
				break
			}
		}
		return res, fmt.Errorf("probe: %d of %d clients could not join room %q; the first: %w", failed, cfg.Clients, cfg.Room, first)
	}

	var mu sync.Mutex // guards res.Sent, res.Acked and res.Errors while sending
	for i, c := range clients {
		wg.Go(func() {
			for k := range cfg.Messages {
				err := sendPaced(ctx, c, func() sdk.Outgoing {
					b, _ := json.Marshal(body{Run: run, From: i, Seq: k, Sent: time.Now().UnixNano()})
					return sdk.Outgoing{Type: "probe", Lane: cfg.Lane, Body: b}
				})
				mu.Lock()
				res.Sent++
				if err == nil {
					res.Acked++
				} else {
					res.addError(fmt.Sprintf("client %d send %d: %v", i, k, err))
				}
				mu.Unlock()
				if err != nil && ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()

	// Wait for what the acked messages should bring, then a little longer for duplicates.
	rec.waitFor(ctx, res.Acked*(cfg.Clients-1), clients)
	settle := time.NewTimer(cfg.Settle)
	select {
	case <-settle.C:
	case <-ctx.Done():
		settle.Stop()
	}
	for i, c := range clients {
		if err := c.Err(); err != nil {
			res.Disconnected++
			res.addError(fmt.Sprintf("client %d disconnected: %v", i, err))
		}
		c.Close() // no more callbacks after this
	}
	rec.fill(&res)
	return res, nil
}

func (r *Result) addError(s string) {
	if len(r.Errors) < maxErrors {
		r.Errors = append(r.Errors, s)
	}
}

// recorder counts what the clients receive.
type recorder struct {
	run      string
	progress chan struct{} // a signal after each new delivery, capacity 1

	mu        sync.Mutex        // guards the fields below
	seen      []map[[2]int]bool // per receiver: (sender, seq) already received
	delivered int
	dup, echo int
	latency   *hdrhistogram.Histogram // microseconds
}

func newRecorder(run string, clients int) *recorder {
	r := &recorder{
		run:      run,
		progress: make(chan struct{}, 1),
		seen:     make([]map[[2]int]bool, clients),
		latency:  hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3),
	}
	for i := range r.seen {
		r.seen[i] = map[[2]int]bool{}
	}
	return r
}

// receive records message m arriving at client i.
func (r *recorder) receive(i int, m *clientpb.Message) {
	now := time.Now()
	var b body
	if json.Unmarshal(m.GetBody(), &b) != nil || b.Run != r.run {
		return // other traffic in the room
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := [2]int{b.From, b.Seq}
	switch {
	case b.From == i:
		r.echo++
	case r.seen[i][key]:
		r.dup++
	default:
		r.seen[i][key] = true
		r.delivered++
		us := max(now.Sub(time.Unix(0, b.Sent)).Microseconds(), 1)
		_ = r.latency.RecordValue(min(us, r.latency.HighestTrackableValue()))
		select {
		case r.progress <- struct{}{}:
		default:
		}
	}
}

// waitFor returns once target messages were delivered, ctx ends, or a client's connection
// ends (after which the target cannot be reached).
func (r *recorder) waitFor(ctx context.Context, target int, clients []*sdk.Client) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		done := r.delivered >= target
		r.mu.Unlock()
		if done {
			return
		}
		for _, c := range clients {
			if c.Err() != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.progress:
		case <-tick.C:
		}
	}
}

// fill copies the counts into res.
func (r *recorder) fill(res *Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res.Delivered, res.Dup, res.Echo = r.delivered, r.dup, r.echo
	res.Lost = res.Expected - res.Delivered
	if r.latency.TotalCount() > 0 {
		res.P50 = time.Duration(r.latency.ValueAtQuantile(50)) * time.Microsecond
		res.P99 = time.Duration(r.latency.ValueAtQuantile(99)) * time.Microsecond
		res.Max = time.Duration(r.latency.Max()) * time.Microsecond
	}
}

// sendPaced sends the message next makes, and again after the server's hint while a send rate
// refuses it (120 SEND_RATE_LIMITED: the clients' burst may pass a room's cap on its members'
// critical messages, 20 at once by default), as a client should.
func sendPaced(ctx context.Context, c *sdk.Client, next func() sdk.Outgoing) error {
	for {
		_, err := c.Send(ctx, next())
		var se *sdk.SendError
		if !errors.As(err, &se) || !errors.Is(err, sdk.ErrSendRateLimited) || se.RetryAfter <= 0 {
			return err
		}
		wait := time.NewTimer(se.RetryAfter)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return err
		}
	}
}
