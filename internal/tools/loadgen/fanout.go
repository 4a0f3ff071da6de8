package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"roomcast/proto/clientpb"
)

// maxBodySize is the protocol's limit on a message body.
const maxBodySize = 16384

// maxTags bounds the distinct tag sets of a targeted run: the workers report their members'
// count per set.
const maxTags = 1 << 20

// LaneCounts are counts by lane.
type LaneCounts struct {
	Critical int64 `json:"critical"`
	Normal   int64 `json:"normal"`
	Bulk     int64 `json:"bulk"`
}

func laneCounts(byLane [4]int64) LaneCounts {
	return LaneCounts{
		Critical: byLane[clientpb.Lane_LANE_CRITICAL],
		Normal:   byLane[clientpb.Lane_LANE_NORMAL] + byLane[clientpb.Lane_LANE_UNSPECIFIED],
		Bulk:     byLane[clientpb.Lane_LANE_BULK],
	}
}

func (c LaneCounts) total() int64 { return c.Critical + c.Normal + c.Bulk }

// FanoutResult is what RunFanout measured. Its JSON is the `roomcast bench fanout --json` line.
type FanoutResult struct {
	Scenario string `json:"scenario"` // "fanout"
	// Placement is where the bench and the server ran, and each server process's usage.
	Placement
	N         int     `json:"n"`
	Room      string  `json:"room"`
	Transport string  `json:"transport"`
	Workers   int     `json:"workers"`
	Rate      float64 `json:"rate"`
	Duration  float64 `json:"duration_sec"`
	TickMS    int64   `json:"tick_ms"` // 0: the server's default
	// LatencyBudgetMS is the room's latency_budget_ms; 0: the server's default.
	LatencyBudgetMS int64  `json:"latency_budget_ms"`
	NoMerge         bool   `json:"no_merge"`
	Lane            string `json:"lane"`
	Size            int    `json:"size"`
	// Tags is the number of distinct tag sets of a targeted run; 0: untargeted.
	Tags int `json:"tags"`

	Connected    int64 `json:"connected"`
	Failed       int64 `json:"failed"`
	Disconnected int64 `json:"disconnected"`
	// Limited counts logins the server refused for now (4013, 4015) that were tried again
	// after its hint (each member ends connected or failed as before).
	Limited int64 `json:"limited"`
	// JoinSec is how long the members took to log in, from the first login to the last
	// answer; LoginsPerSec is Connected over it.
	JoinSec      float64 `json:"join_sec"`
	LoginsPerSec float64 `json:"logins_per_sec"`
	// Slow is how many members logged in and then never read (--slow), on top of N;
	// ServerSlowReaderCloses counts the server's slow-reader closes over the run window.
	Slow                   int     `json:"slow"`
	ServerSlowReaderCloses float64 `json:"server_slow_reader_closes"`
	// LiveState says the members asked for the room's live state (--live-state); LiveFrames
	// counts the live state frames (viewer counts, member notices, attributes) they received
	// from their login to the end, LiveFramesPerMemberMin that per member and minute of the
	// run window.
	LiveState              bool    `json:"live_state"`
	LiveFrames             int64   `json:"live_frames"`
	LiveFramesPerMemberMin float64 `json:"live_frames_per_member_min"`
	// Churn is the extra members a second that logged in while the bench published, each
	// staying churnLife (--churn); ChurnLogins counts those that did, ChurnFailed those that
	// could not.
	Churn       float64 `json:"churn"`
	ChurnLogins int64   `json:"churn_logins"`
	ChurnFailed int64   `json:"churn_failed"`

	// Published counts messages the server API accepted, PublishFailed those it refused or
	// did not answer; PublishedPerSec is the achieved publish rate.
	Published       int64   `json:"published"`
	PublishFailed   int64   `json:"publish_failed"`
	PublishedPerSec float64 `json:"published_per_sec"`
	// PublishP50MS and PublishP99MS are the server API's answer times.
	PublishP50MS float64 `json:"publish_p50_ms"`
	PublishP99MS float64 `json:"publish_p99_ms"`

	// Expected is, for every accepted message, the number of members that logged in and are
	// in its audience (all of them when untargeted); Delivered counts distinct (member,
	// message) pairs received within the audience; Lost is the difference. Leaked counts
	// receipts by members outside the message's audience: a leak fails the run.
	// MeanAudience is Expected / Published.
	Expected          int64      `json:"expected"`
	Delivered         int64      `json:"delivered"`
	Lost              int64      `json:"lost"`
	LostCritical      int64      `json:"lost_critical"`
	ExpectedByLane    LaneCounts `json:"expected_by_lane"`
	DeliveredByLane   LaneCounts `json:"delivered_by_lane"`
	Dup               int64      `json:"dup"`
	Leaked            int64      `json:"leaked"`
	IncompleteMembers int64      `json:"incomplete_members"`
	MeanAudience      float64    `json:"mean_audience"`

	// DeliveriesPerSec is Delivered over the time from the first send to the last receipt.
	DeliveriesPerSec float64 `json:"deliveries_per_sec"`
	// ServerCPUSeconds is the server's CPU time (user+system) over the run window, from just
	// before the first send to after the last receipt; DeliveriesPerServerCPUSec is Delivered
	// over it.
	ServerCPUSeconds          float64 `json:"server_cpu_seconds"`
	DeliveriesPerServerCPUSec float64 `json:"deliveries_per_server_cpu_sec"`
	// ServerCPUPerMessageUS is ServerCPUSeconds over Published, in µs: with one member, the
	// way in's cost of a message (docs/benchmarks.md).
	ServerCPUPerMessageUS float64 `json:"server_cpu_us_per_message"`
	// ServerDeliveries and ServerDrops are the server's own counters over the run window
	// (roomcast_chatlink_deliveries_total, roomcast_chatlink_drops_total by "lane/reason").
	ServerDeliveries float64            `json:"server_deliveries"`
	ServerDrops      map[string]float64 `json:"server_drops,omitempty"`

	// Latencies from the send time in the message body to its receipt, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`

	BenchCPUSeconds  float64  `json:"bench_cpu_seconds"`
	BenchMaxRSSBytes int64    `json:"bench_max_rss_bytes"`
	Errors           []string `json:"errors,omitempty"`
}

// OK reports whether the run was clean where it must be: every member joined, every message
// was accepted, no critical message was lost and none reached a member outside its audience.
func (r FanoutResult) OK() bool {
	return r.Connected == int64(r.N) && r.Failed == 0 && r.PublishFailed == 0 && r.LostCritical == 0 && r.Leaked == 0 &&
		r.Published > 0
}

// String is the human summary.
func (r FanoutResult) String() string {
	var b strings.Builder
	merge := "merged"
	if r.NoMerge {
		merge = "no-merge"
	}
	tick := "server default"
	if r.TickMS > 0 {
		tick = fmt.Sprintf("%dms", r.TickMS)
	}
	if r.LatencyBudgetMS > 0 {
		tick += fmt.Sprintf(" latency-budget=%dms", r.LatencyBudgetMS)
	}
	tags := "untargeted"
	if r.Tags > 0 {
		tags = fmt.Sprintf("tags=%d", r.Tags)
	}
	fmt.Fprintf(&b, "fanout: n=%d rate=%g/s duration=%gs tick=%s %s %s lane=%s size=%dB transport=%s workers=%d\n",
		r.N, r.Rate, r.Duration, tick, merge, tags, r.Lane, r.Size, r.Transport, r.Workers)
	fmt.Fprintf(&b, "  members     connected=%d failed=%d disconnected=%d limited-and-retried=%d, joined in %.1fs (%.0f logins/s)\n",
		r.Connected, r.Failed, r.Disconnected, r.Limited, r.JoinSec, r.LoginsPerSec)
	if r.Slow > 0 {
		fmt.Fprintf(&b, "  slow        %d members never read; the server closed %.0f as slow readers\n", r.Slow, r.ServerSlowReaderCloses)
	}
	if r.LiveState || r.Churn > 0 {
		fmt.Fprintf(&b, "  live state  asked=%v: %d frames (%.2f a member a minute); churn %g/s: %d extra logins, %d failed\n",
			r.LiveState, r.LiveFrames, r.LiveFramesPerMemberMin, r.Churn, r.ChurnLogins, r.ChurnFailed)
	}
	fmt.Fprintf(&b, "  published   %d accepted, %d failed, %.1f/s, API answer p50 %.1fms p99 %.1fms\n",
		r.Published, r.PublishFailed, r.PublishedPerSec, r.PublishP50MS, r.PublishP99MS)
	fmt.Fprintf(&b, "  delivered   %d/%d (lost %d, lost_critical %d, dup %d, leaked %d, incomplete members %d), mean audience %.1f\n",
		r.Delivered, r.Expected, r.Lost, r.LostCritical, r.Dup, r.Leaked, r.IncompleteMembers, r.MeanAudience)
	fmt.Fprintf(&b, "  by lane     critical %d/%d  normal %d/%d  bulk %d/%d\n",
		r.DeliveredByLane.Critical, r.ExpectedByLane.Critical, r.DeliveredByLane.Normal, r.ExpectedByLane.Normal,
		r.DeliveredByLane.Bulk, r.ExpectedByLane.Bulk)
	fmt.Fprintf(&b, "  throughput  %.0f deliveries/s, %.0f deliveries per server CPU-second (server %.2f CPU-s, %.0f µs a message)\n",
		r.DeliveriesPerSec, r.DeliveriesPerServerCPUSec, r.ServerCPUSeconds, r.ServerCPUPerMessageUS)
	fmt.Fprintf(&b, "  latency     p50 %.1fms  p99 %.1fms  max %.1fms\n", r.P50MS, r.P99MS, r.MaxMS)
	if len(r.ServerDrops) > 0 {
		keys := make([]string, 0, len(r.ServerDrops))
		for k := range r.ServerDrops {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("  server drops")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%.0f", k, r.ServerDrops[k])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  bench       %.1f CPU-s, peak RSS %.0f MiB", r.BenchCPUSeconds, float64(r.BenchMaxRSSBytes)/(1<<20))
	b.WriteString("\n" + r.Placement.summary())
	return b.String()
}

func (c Config) validateFanout() error {
	switch {
	case c.Tags < 0 || c.Tags > maxTags:
		return fmt.Errorf("bench: tags must be 0 (untargeted) to %d, got %d", maxTags, c.Tags)
	case c.Rate <= 0:
		return errors.New("bench: fanout needs a positive rate")
	case c.Batch < 0 || c.Batch > 100:
		return fmt.Errorf("bench: batch must be 1 to 100 messages, got %d", c.Batch)
	case c.APIStream != "" && c.Batch > 1:
		return errors.New("bench: a send stream carries one message a send: --api-stream takes no --batch")
	case c.APIKey == "":
		return errors.New("bench: fanout needs the server API key")
	case c.Size < bodyHeader || c.Size > maxBodySize:
		return fmt.Errorf("bench: size must be %d to %d bytes, got %d", bodyHeader, maxBodySize, c.Size)
	case c.Lane != "critical" && c.Lane != "normal" && c.Lane != "bulk" && c.Lane != "mix":
		return fmt.Errorf("bench: lane must be critical, normal, bulk or mix, not %q", c.Lane)
	case c.Tick < 0 || c.Tick%time.Millisecond != 0:
		return fmt.Errorf("bench: tick %v must be a whole number of milliseconds", c.Tick)
	case c.LatencyBudget < 0 || c.LatencyBudget%time.Millisecond != 0:
		return fmt.Errorf("bench: latency budget %v must be a whole number of milliseconds", c.LatencyBudget)
	case c.Slow < 0 || c.Slow > 1000:
		return fmt.Errorf("bench: slow must be 0 to 1000 members, got %d", c.Slow)
	case c.LiveState && c.Client != ClientRaw:
		return errors.New("bench: --live-state is for raw members (--client raw); the SDK always asks for the live state")
	case c.Churn < 0 || c.Churn > 200:
		return fmt.Errorf("bench: churn must be 0 to 200 logins a second, got %v", c.Churn)
	case c.LoginRate < 0:
		return fmt.Errorf("bench: login rate must be 0 (paced by --concurrency) or positive, got %v", c.LoginRate)
	}
	return nil
}

// RunFanout puts cfg.N members in one room, lifts the room's per-member budgets and sets its
// flush tick and merging, publishes cfg.Rate messages per second for cfg.Duration through the
// server API, waits up to cfg.Wait for stragglers, and reports. The result is filled in as far
// as the run got, also with an error.
func RunFanout(ctx context.Context, cfg Config) (FanoutResult, error) {
	cfg, err := cfg.withDefaults()
	res := FanoutResult{
		Scenario: "fanout", N: cfg.N, Transport: cfg.Transport, Rate: cfg.Rate, Duration: cfg.Duration.Seconds(),
		TickMS: cfg.Tick.Milliseconds(), LatencyBudgetMS: cfg.LatencyBudget.Milliseconds(), NoMerge: cfg.NoMerge, Lane: cfg.Lane, Size: cfg.Size, Tags: cfg.Tags,
		LiveState: cfg.LiveState, Churn: cfg.Churn,
	}
	if err != nil {
		return res, err
	}
	if err := cfg.validateFanout(); err != nil {
		return res, err
	}
	r, err := newRunner(cfg)
	defer r.stop()
	if err != nil {
		return res, err
	}
	res.Room = r.room
	// Everything is to be delivered: the bench measures fan-out, not the budgets.
	err = putSettings(ctx, r.hc, cfg.API, cfg.APIKey, r.room, roomSettings{
		FlushTickMS: uint32(cfg.Tick.Milliseconds()), LatencyBudgetMS: uint32(cfg.LatencyBudget.Milliseconds()),
		NoMerge: cfg.NoMerge, NormalBudget: -1, CriticalBudget: -1, BulkPerSecond: -1,
	})
	if err != nil {
		return res, err
	}

	// Room for two seconds of messages between the reader and the recorder.
	buffer := min(max(256, int(2*cfg.Rate)), 8192)
	if err := r.start("fanout", cfg.LoginRate, buffer); err != nil {
		return res, err
	}
	res.Workers = len(r.workers)
	joinStart := time.Now()
	if err := r.connect(ctx, "joined"); err != nil {
		return res, err
	}
	st := r.status()
	res.Connected, res.Failed = st.Connected, st.Failed
	if res.JoinSec = time.Since(joinStart).Seconds(); res.JoinSec > 0 {
		res.LoginsPerSec = float64(res.Connected) / res.JoinSec
	}
	if st.Connected == 0 {
		return res, errors.New("bench: no member could join the room")
	}
	for i := range cfg.Slow {
		sc, err := dialSlow(ctx, cfg, r.hc, r.room, fmt.Sprintf("bench-%x-slow-%d", r.id, i))
		if err != nil {
			return res, err
		}
		defer sc.Close()
		res.Slow++
	}

	if cfg.Pause > 0 {
		r.progress("%d members joined; idle for %v before publishing", res.Connected, cfg.Pause)
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
	tags := tagging{groups: cfg.Tags}
	pub := newPublisher(cfg.API, cfg.APIKey, r.room, cfg.Lane, cfg.Size, r.id, tags, cfg.Senders, cfg.Batch, tlsConfig(cfg.caPEM))
	total := int64(cfg.Rate * cfg.Duration.Seconds())
	stop := r.everySecond(func() {
		pub.mu.Lock()
		sent, failed := pub.sent, pub.failed
		pub.mu.Unlock()
		d := r.status().Delivered
		r.progress("%s published %d/%d (%d failed), delivered %d", bar(sent, total), sent, total, failed, d)
	})
	churnCtx, stopChurn := context.WithCancel(ctx)
	churned := make(chan churnCounts, 1)
	go func() { churned <- churn(churnCtx, cfg, r.hc, r.room, r.id) }()
	if cfg.APIStream != "" {
		pub.runStream(ctx, cfg.APIStream, tlsConfig(cfg.caPEM), cfg.Rate, cfg.Duration)
	} else {
		pub.run(ctx, cfg.Rate, cfg.Duration, cfg.Senders)
	}
	stopChurn()
	cc := <-churned
	res.ChurnLogins, res.ChurnFailed = cc.logins, cc.failed
	stop()

	stop = r.everySecond(func() {
		r.progress("waiting for stragglers: delivered %d", r.status().Delivered)
	})
	rep, err := r.finish(ctx, pub.ok, cfg.Wait)
	stop()
	if err != nil {
		return res, err
	}
	after, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}

	res.Published, res.PublishFailed = pub.ok.len(), pub.failed
	if span := pub.last.Sub(pub.first).Seconds(); span > 0 {
		res.PublishedPerSec = float64(pub.sent) / span
	}
	res.PublishP50MS, res.PublishP99MS, _ = quantiles(pub.latency.Export())
	// Exact expectations: each accepted message, times the members of its audience that
	// logged in (the workers count them by tag group).
	var expected [4]int64
	pub.ok.each(func(seq uint64) {
		expected[laneValue(pub.laneOf(seq))] += tags.target(seq).audienceSize(rep.Groups)
	})
	res.Connected, res.Failed, res.Disconnected, res.Limited = rep.Connected, rep.Failed, rep.Disconnected, rep.Limited
	res.ExpectedByLane, res.DeliveredByLane = laneCounts(expected), laneCounts(rep.Lanes)
	res.Expected, res.Delivered = res.ExpectedByLane.total(), res.DeliveredByLane.total()
	res.Lost = res.Expected - res.Delivered
	res.LostCritical = res.ExpectedByLane.Critical - res.DeliveredByLane.Critical
	res.Dup, res.Leaked, res.IncompleteMembers = rep.Dup, rep.Leaked, rep.Incomplete
	res.LiveFrames = rep.LiveFrames
	if rep.LastRecv > 0 && rep.LoginStart > 0 && res.Connected > 0 {
		if mins := time.Duration(rep.LastRecv - rep.LoginStart).Minutes(); mins > 0 {
			res.LiveFramesPerMemberMin = float64(rep.LiveFrames) / float64(res.Connected) / mins
		}
	}
	if res.Published > 0 {
		res.MeanAudience = float64(res.Expected) / float64(res.Published)
	}
	if rep.LastRecv > 0 && !pub.first.IsZero() {
		if span := time.Duration(rep.LastRecv - pub.first.UnixNano()).Seconds(); span > 0 {
			res.DeliveriesPerSec = float64(res.Delivered) / span
		}
	}
	res.ServerCPUSeconds = after.cpu - before.cpu
	res.Placement = r.placement(before, after)
	if res.ServerCPUSeconds > 0 {
		res.DeliveriesPerServerCPUSec = float64(res.Delivered) / res.ServerCPUSeconds
	}
	if res.Published > 0 {
		res.ServerCPUPerMessageUS = res.ServerCPUSeconds / float64(res.Published) * 1e6
	}
	res.ServerDeliveries = after.deliveries - before.deliveries
	res.ServerSlowReaderCloses = after.slowCloses - before.slowCloses
	for k, v := range after.drops {
		if d := v - before.drops[k]; d > 0 {
			if res.ServerDrops == nil {
				res.ServerDrops = map[string]float64{}
			}
			res.ServerDrops[k] = d
		}
	}
	res.P50MS, res.P99MS, res.MaxMS = quantiles(rep.Latency)
	res.BenchCPUSeconds, res.BenchMaxRSSBytes = rep.CPUSeconds, rep.MaxRSSBytes
	res.Errors = append(append(rep.Errors, pub.errors...), cc.errs...)
	if len(res.Errors) > maxErrors {
		res.Errors = res.Errors[:maxErrors]
	}
	return res, nil
}
