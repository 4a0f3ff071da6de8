package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"roomcast/proto/clientpb"
)

// UploadResult is what RunUpload measured. Its JSON is the `roomcast bench upload --json` line.
type UploadResult struct {
	Scenario string `json:"scenario"` // "upload"
	Placement
	N         int     `json:"n"`
	Room      string  `json:"room"`
	Transport string  `json:"transport"`
	Uploaders int     `json:"uploaders"`
	EveryMS   int64   `json:"every_ms"` // each uploader sends one message this often
	Rate      float64 `json:"rate"`     // the upload rate it makes, messages a second
	Duration  float64 `json:"duration_sec"`
	TickMS    int64   `json:"tick_ms"` // 0: the server's default
	Lane      string  `json:"lane"`
	Size      int     `json:"size"`

	Connected    int64 `json:"connected"`
	Failed       int64 `json:"failed"`
	Disconnected int64 `json:"disconnected"`
	// Nodes is how many ChatLinks the members logged in to (from their LoginAcks).
	Nodes int `json:"nodes"`

	// Sent counts the members' Send frames; Accepted those answered with a SendAck, Refused
	// those answered with an Error (by code in RefusedBy), Unanswered those with no answer by
	// the run's end. SentPerSec is the achieved upload rate.
	Sent       int64            `json:"sent"`
	Accepted   int64            `json:"accepted"`
	Refused    int64            `json:"refused"`
	RefusedBy  map[string]int64 `json:"refused_by,omitempty"`
	Unanswered int64            `json:"unanswered"`
	SentPerSec float64          `json:"sent_per_sec"`
	// AnswerP50MS and AnswerP99MS are the times from a Send to its answer.
	AnswerP50MS float64 `json:"answer_p50_ms"`
	AnswerP99MS float64 `json:"answer_p99_ms"`

	// RoomSendRequests is the room service's send requests answered over the run (all rooms:
	// run it against a server with no other traffic), RoomSendRequestsPerNodeSec that over the
	// run's seconds and Nodes: the bus messages a ChatLink sent the room service a second.
	RoomSendRequests           float64 `json:"room_send_requests"`
	RoomSendRequestsPerNodeSec float64 `json:"room_send_requests_per_node_sec"`
	// Sampled counts the bulk messages the room's cap left out before the bus (the room
	// service's roomcast_room_bulk_sampled_out_total over the run).
	Sampled float64 `json:"sampled"`

	// Expected is every accepted message times the other members (a sender gets no echo);
	// Delivered the distinct (member, message) receipts; Thinned what the members' Pushes said
	// was left out of their streams (budgets, flow control); SampledDeliveries Sampled times
	// the other members. Unaccounted is Expected less the other three: messages neither
	// delivered nor counted as left out.
	Expected          int64   `json:"expected"`
	Delivered         int64   `json:"delivered"`
	Thinned           int64   `json:"thinned"`
	SampledDeliveries int64   `json:"sampled_deliveries"`
	Unaccounted       int64   `json:"unaccounted"`
	Dup               int64   `json:"dup"`
	ServerDeliveries  float64 `json:"server_deliveries"`
	// Latencies from a member's send (the time in the body) to another member's receipt.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`

	// ServerCPUSeconds is the server's CPU time over the run window; ServerCPUPerUploadUS is
	// it over Sent, in µs: what an uploaded message costs the server, its fan-out included.
	ServerCPUSeconds     float64 `json:"server_cpu_seconds"`
	ServerCPUPerUploadUS float64 `json:"server_cpu_us_per_upload"`

	BenchCPUSeconds  float64  `json:"bench_cpu_seconds"`
	BenchMaxRSSBytes int64    `json:"bench_max_rss_bytes"`
	Errors           []string `json:"errors,omitempty"`
}

// OK reports whether the run was clean where it must be: every member joined, every send was
// answered, and nothing was lost unaccounted.
func (r UploadResult) OK() bool {
	return r.Connected == int64(r.N) && r.Failed == 0 && r.Sent > 0 && r.Unanswered == 0 && r.Unaccounted <= 0
}

// String is the human summary.
func (r UploadResult) String() string {
	var b strings.Builder
	tick := "server default"
	if r.TickMS > 0 {
		tick = fmt.Sprintf("%dms", r.TickMS)
	}
	fmt.Fprintf(&b, "upload: n=%d uploaders=%d every=%dms (%.0f/s) duration=%gs tick=%s lane=%s size=%dB transport=%s\n",
		r.N, r.Uploaders, r.EveryMS, r.Rate, r.Duration, tick, r.Lane, r.Size, r.Transport)
	fmt.Fprintf(&b, "  members     connected=%d failed=%d disconnected=%d on %d node(s)\n", r.Connected, r.Failed, r.Disconnected, r.Nodes)
	fmt.Fprintf(&b, "  sent        %d (%.1f/s): accepted %d, refused %d, unanswered %d; answer p50 %.1fms p99 %.1fms\n",
		r.Sent, r.SentPerSec, r.Accepted, r.Refused, r.Unanswered, r.AnswerP50MS, r.AnswerP99MS)
	if len(r.RefusedBy) > 0 {
		keys := make([]string, 0, len(r.RefusedBy))
		for k := range r.RefusedBy {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("  refused by ")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, r.RefusedBy[k])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  bus         %.0f send requests into the room service, %.1f a second per ChatLink; %.0f bulk sampled out\n",
		r.RoomSendRequests, r.RoomSendRequestsPerNodeSec, r.Sampled)
	fmt.Fprintf(&b, "  delivered   %d of %d expected; thinned %d, sampled %d, unaccounted %d, dup %d\n",
		r.Delivered, r.Expected, r.Thinned, r.SampledDeliveries, r.Unaccounted, r.Dup)
	fmt.Fprintf(&b, "  latency     send to other members' receipt: p50 %.1fms  p99 %.1fms  max %.1fms\n", r.P50MS, r.P99MS, r.MaxMS)
	fmt.Fprintf(&b, "  server      %.2f CPU-s, %.0f µs an uploaded message\n", r.ServerCPUSeconds, r.ServerCPUPerUploadUS)
	fmt.Fprintf(&b, "  bench       %.1f CPU-s, peak RSS %.0f MiB", r.BenchCPUSeconds, float64(r.BenchMaxRSSBytes)/(1<<20))
	b.WriteString("\n" + r.Placement.summary())
	return b.String()
}

func (c Config) validateUpload() error {
	switch {
	case c.Uploaders < 1 || c.Uploaders > c.N:
		return fmt.Errorf("bench: uploaders must be 1 to n (%d), got %d", c.N, c.Uploaders)
	case c.Every <= 0:
		return errors.New("bench: upload needs a positive --every")
	case c.N > c.PerProcess:
		return fmt.Errorf("bench: upload runs its members in one process: n (%d) must be at most --per-process (%d)", c.N, c.PerProcess)
	case c.APIKey == "":
		return errors.New("bench: upload needs the server API key (for the room's settings)")
	case c.Size < bodyHeader || c.Size > maxBodySize:
		return fmt.Errorf("bench: size must be %d to %d bytes, got %d", bodyHeader, maxBodySize, c.Size)
	case c.Lane != "normal" && c.Lane != "bulk":
		return fmt.Errorf("bench: a member uploads on the normal or bulk lane, not %q", c.Lane)
	case c.Tick < 0 || c.Tick%time.Millisecond != 0:
		return fmt.Errorf("bench: tick %v must be a whole number of milliseconds", c.Tick)
	}
	return nil
}

// uploads are the members' sends of a run and their answers.
type uploads struct {
	mu        sync.Mutex // guards the fields below
	sentAt    map[uint64]int64
	accepted  seqSet
	refused   map[string]int64
	answerLat *hdrhistogram.Histogram
	sent      int64
	answered  int64
}

func newUploads() *uploads {
	return &uploads{sentAt: map[uint64]int64{}, refused: map[string]int64{}, answerLat: newLatencyHistogram()}
}

func (u *uploads) sending(seq uint64, at int64) {
	u.mu.Lock()
	u.sentAt[seq] = at
	u.sent++
	u.mu.Unlock()
}

// answer takes the answer to Send seq: code 0 accepted it. A second answer to one send is an
// error of the server's, counted as a refusal "DUPLICATE_ANSWER".
func (u *uploads) answer(seq uint64, code uint32) {
	now := time.Now().UnixNano()
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.sentAt[seq]
	if !ok {
		u.refused["DUPLICATE_ANSWER"]++
		return
	}
	delete(u.sentAt, seq)
	u.answered++
	recordLatency(u.answerLat, time.Duration(now-at))
	if code == 0 {
		u.accepted.add(seq)
		return
	}
	u.refused[clientpb.ErrorCode(code).String()]++
}

// notSent takes back a send the bench could not write: it counts as refused, "NOT_SENT".
func (u *uploads) notSent(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.sentAt, seq)
	u.answered++
	u.refused["NOT_SENT"]++
}

func (u *uploads) pending() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sent - u.answered
}

// RunUpload puts cfg.N members in one fresh room (its settings the server's defaults, with
// cfg.Tick), and has the first cfg.Uploaders of them send one message each every cfg.Every for
// cfg.Duration, spread evenly; it waits for the answers and for the deliveries to stop, and
// reports what the server did with the uploads and what it cost.
func RunUpload(ctx context.Context, cfg Config) (UploadResult, error) {
	cfg, err := cfg.withDefaults()
	res := UploadResult{
		Scenario: "upload", N: cfg.N, Transport: cfg.Transport, Uploaders: cfg.Uploaders, EveryMS: cfg.Every.Milliseconds(),
		Duration: cfg.Duration.Seconds(), TickMS: cfg.Tick.Milliseconds(), Lane: cfg.Lane, Size: cfg.Size,
	}
	if err != nil {
		return res, err
	}
	if err := cfg.validateUpload(); err != nil {
		return res, err
	}
	res.Rate = float64(cfg.Uploaders) / cfg.Every.Seconds()
	r, err := newRunner(cfg)
	defer r.stop()
	if err != nil {
		return res, err
	}
	res.Room = r.room
	if err := putSettings(ctx, r.hc, cfg.API, cfg.APIKey, r.room, roomSettings{FlushTickMS: uint32(cfg.Tick.Milliseconds())}); err != nil {
		return res, err
	}
	if err := r.start("upload", 0, 0); err != nil {
		return res, err
	}
	f := r.workers[0].(*localWorker).f
	up := newUploads()
	f.uploads = up
	if err := r.connect(ctx, "joined"); err != nil {
		return res, err
	}
	var senders []*rawClient
	nodes := map[string]bool{}
	for i := range f.members {
		if m := f.members[i].Load(); m != nil {
			rc := m.c.(*rawClient)
			nodes[rc.node] = true
			if i < cfg.Uploaders {
				senders = append(senders, rc)
			}
		}
	}
	res.Nodes = len(nodes)
	if len(senders) == 0 {
		return res, errors.New("bench: no uploader could join the room")
	}
	if cfg.Pause > 0 {
		r.progress("%d members joined; idle for %v before uploading", f.connected.Load(), cfg.Pause)
		select {
		case <-time.After(cfg.Pause):
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	before, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}
	lane := clientpb.Lane_LANE_BULK
	if cfg.Lane == "normal" {
		lane = clientpb.Lane_LANE_NORMAL
	}
	total := int64(float64(len(senders)) * cfg.Duration.Seconds() / cfg.Every.Seconds())
	stop := r.everySecond(func() {
		up.mu.Lock()
		sent, answered := up.sent, up.answered
		up.mu.Unlock()
		r.progress("%s uploaded %d/%d (%d answered), delivered %d", bar(sent, total), sent, total, answered, f.status().Delivered)
	})
	start := time.Now()
	sendUploads(ctx, senders, up, r.id, lane, cfg.Size, cfg.Every, total, start)
	end := time.Now()
	stop()
	// The answers, then the deliveries: done when nothing more arrives for a second (or two
	// ticks), within cfg.Wait.
	quiet := max(time.Second, 2*cfg.Tick)
	deadline := time.Now().Add(cfg.Wait)
	last, lastChange := int64(-1), time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		d := f.status().Delivered
		if d != last {
			last, lastChange = d, time.Now()
		}
		if up.pending() == 0 && time.Since(lastChange) >= quiet {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep := f.finish(nil)
	after, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}

	up.mu.Lock()
	res.Sent, res.Accepted = up.sent, up.accepted.len()
	res.Unanswered = up.sent - up.answered
	for k, v := range up.refused {
		if res.RefusedBy == nil {
			res.RefusedBy = map[string]int64{}
		}
		res.RefusedBy[k] = v
		res.Refused += v
	}
	res.AnswerP50MS, res.AnswerP99MS, _ = quantiles(up.answerLat.Export())
	up.mu.Unlock()
	if span := end.Sub(start).Seconds(); span > 0 {
		res.SentPerSec = float64(res.Sent) / span
		res.RoomSendRequests = after.roomSends - before.roomSends
		res.RoomSendRequestsPerNodeSec = res.RoomSendRequests / span / float64(max(res.Nodes, 1))
	}
	res.Connected, res.Failed, res.Disconnected = rep.Connected, rep.Failed, rep.Disconnected
	others := max(rep.Connected-1, 0)
	res.Sampled = after.roomSampled - before.roomSampled
	res.Expected = res.Accepted * others
	res.Delivered = rep.Lanes[0] + rep.Lanes[1] + rep.Lanes[2] + rep.Lanes[3]
	res.Thinned = rep.Thinned
	res.SampledDeliveries = int64(res.Sampled) * others
	res.Unaccounted = res.Expected - res.Delivered - res.Thinned - res.SampledDeliveries
	res.Dup = rep.Dup
	res.ServerDeliveries = after.deliveries - before.deliveries
	res.P50MS, res.P99MS, res.MaxMS = quantiles(rep.Latency)
	res.ServerCPUSeconds = after.cpu - before.cpu
	res.Placement = r.placement(before, after)
	if res.Sent > 0 {
		res.ServerCPUPerUploadUS = res.ServerCPUSeconds / float64(res.Sent) * 1e6
	}
	res.BenchCPUSeconds, res.BenchMaxRSSBytes = rep.CPUSeconds, rep.MaxRSSBytes
	res.Errors = rep.Errors
	return res, nil
}

// sendUploads sends total messages from senders in turn, one every every/len(senders), so
// that each sender sends one every every; it returns after the last one (or when ctx ends).
func sendUploads(ctx context.Context, senders []*rawClient, up *uploads, run runID, lane clientpb.Lane, size int,
	every time.Duration, total int64, start time.Time) {
	gap := every / time.Duration(len(senders))
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var body []byte
	for j := int64(0); j < total; {
		for ; j < total; j++ {
			due := start.Add(time.Duration(j) * gap)
			if time.Now().Before(due) {
				break
			}
			seq := uint64(j + 1)
			now := time.Now().UnixNano()
			body = appendBody(body[:0], run, seq, now, size)
			up.sending(seq, now)
			if err := senders[j%int64(len(senders))].send(seq, lane, body); err != nil {
				up.notSent(seq)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
