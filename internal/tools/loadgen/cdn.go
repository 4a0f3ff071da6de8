package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/tools/cdnedge"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// Server metrics bench cdn reads.
const (
	metricPusherMessages = "roomcast_cdnpusher_messages_total"
	metricPusherSampled  = "roomcast_cdnpusher_sampled_messages_total"
	metricPusherSegments = "roomcast_cdnpusher_segments_written_total"
	metricPusherBytes    = "roomcast_cdnpusher_segment_bytes_total"
)

// longLinkTick is how a ChatLink groups a room's messages into frames by default (its flush
// tick), for the long-link bytes bench cdn compares with.
const longLinkTick = 100 // ms

// defaultConns is how many keep-alive connections the virtual viewers share.
const defaultConns = 128

// CDNResult is what RunCDN measured. Its JSON is the `roomcast bench cdn --json` line.
type CDNResult struct {
	Scenario string `json:"scenario"` // "cdn"
	// Placement is where the bench and the server ran, and each server process's usage.
	Placement
	Viewers  int     `json:"viewers"`
	Room     string  `json:"room"`
	Rate     float64 `json:"rate"`
	Duration float64 `json:"duration_sec"`
	Size     int     `json:"size"`
	Conns    int     `json:"conns"`
	// Edge is the CDN edge the viewers polled: "nginx" when the bench ran one, else its URL.
	Edge         string `json:"edge"`
	WindowMS     uint32 `json:"window_ms"`
	PollJitterMS uint32 `json:"poll_jitter_ms"`

	// Published counts the bulk messages the server API accepted, PublishedPerSec their rate.
	Published       int64   `json:"published"`
	PublishFailed   int64   `json:"publish_failed"`
	PublishedPerSec float64 `json:"published_per_sec"`
	// The pusher's counters over the run (the server's /metrics): messages it aggregated per
	// second, of which it sampled away; segments it wrote and their bytes.
	PusherMessagesPerSec float64 `json:"pusher_messages_per_sec"`
	PusherSampled        float64 `json:"pusher_sampled"`
	SegmentsWritten      float64 `json:"segments_written"`
	SegmentBytes         float64 `json:"segment_bytes"`
	ServerCPUSeconds     float64 `json:"server_cpu_seconds"`

	// Windows is how many windows every viewer polled. Polls are the viewers' requests, Hits
	// the segments they got, Misses the 404s (polled again a fifth of a window later),
	// Failures other answers and broken connections, GaveUp the polls abandoned after
	// maxPollTries.
	Windows  int   `json:"windows"`
	Polls    int64 `json:"polls"`
	Hits     int64 `json:"hits"`
	Misses   int64 `json:"misses"`
	Failures int64 `json:"failures"`
	GaveUp   int64 `json:"gave_up"`
	// PollsPerViewerPerWindow is Polls / (Viewers × Windows); PollsPerSec the edge's request
	// rate over the polling.
	PollsPerViewerPerWindow float64 `json:"polls_per_viewer_per_window"`
	PollsPerSec             float64 `json:"polls_per_sec"`
	// OriginRequests counts the segment requests that reached the origin through the edge
	// (-1 with an edge of --edge, which the bench cannot see behind); per segment polled, and
	// the most for one segment.
	OriginRequests           int64   `json:"origin_requests"`
	OriginRequestsPerSegment float64 `json:"origin_requests_per_segment"`
	OriginMaxPerSegment      int64   `json:"origin_max_per_segment"`
	// Bytes each viewer received per second over HTTP (answers' headers and bodies), against
	// the bytes of the long-link frames (Push frames of the ChatLink's default 100 ms tick,
	// WebSocket framing) that would carry the same messages: those of the segments polled.
	SegmentMessages              float64 `json:"segment_messages"` // per segment, mean
	BytesPerViewerPerSec         float64 `json:"bytes_per_viewer_per_sec"`
	LongLinkBytesPerViewerPerSec float64 `json:"long_link_bytes_per_viewer_per_sec"`
	// How long after it was due (its window's end, the grace, a tenth of a window, the
	// viewer's jitter) each segment was in a viewer's hands.
	PollLateP50MS float64 `json:"poll_late_p50_ms"`
	PollLateP99MS float64 `json:"poll_late_p99_ms"`
	PollLateMaxMS float64 `json:"poll_late_max_ms"`

	BenchCPUSeconds  float64  `json:"bench_cpu_seconds"`
	BenchMaxRSSBytes int64    `json:"bench_max_rss_bytes"`
	Errors           []string `json:"errors,omitempty"`
}

// OK reports whether every viewer got every window's segment, every message was accepted, and
// the edge kept the origin to at most 2 requests per segment.
func (r CDNResult) OK() bool {
	return r.Windows > 0 && r.Hits == int64(r.Viewers)*int64(r.Windows) && r.PublishFailed == 0 &&
		r.OriginMaxPerSegment <= 2
}

// String is the human summary.
func (r CDNResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cdn: viewers=%d rate=%g/s duration=%gs size=%dB window=%dms jitter=%dms conns=%d edge=%s\n",
		r.Viewers, r.Rate, r.Duration, r.Size, r.WindowMS, r.PollJitterMS, r.Conns, r.Edge)
	fmt.Fprintf(&b, "  published   %d accepted, %d failed, %.1f/s\n", r.Published, r.PublishFailed, r.PublishedPerSec)
	fmt.Fprintf(&b, "  pusher      %.0f messages/s aggregated, %.0f sampled away, %.0f segments, %.0f bytes (server %.2f CPU-s)\n",
		r.PusherMessagesPerSec, r.PusherSampled, r.SegmentsWritten, r.SegmentBytes, r.ServerCPUSeconds)
	fmt.Fprintf(&b, "  viewers     %d windows: %d polls (%.0f/s), %d hits, %d misses, %d failures, %d given up\n",
		r.Windows, r.Polls, r.PollsPerSec, r.Hits, r.Misses, r.Failures, r.GaveUp)
	fmt.Fprintf(&b, "  per window  %.3f polls per viewer\n", r.PollsPerViewerPerWindow)
	if r.OriginRequests >= 0 {
		fmt.Fprintf(&b, "  origin      %d requests, %.2f per segment, at most %d\n", r.OriginRequests, r.OriginRequestsPerSegment, r.OriginMaxPerSegment)
	}
	fmt.Fprintf(&b, "  bytes       %.0f B/s per viewer over the CDN (%.0f messages a segment) vs %.0f B/s over the long link\n",
		r.BytesPerViewerPerSec, r.SegmentMessages, r.LongLinkBytesPerViewerPerSec)
	fmt.Fprintf(&b, "  lateness    p50 %.1fms  p99 %.1fms  max %.1fms after due\n", r.PollLateP50MS, r.PollLateP99MS, r.PollLateMaxMS)
	fmt.Fprintf(&b, "  bench       %.1f CPU-s, peak RSS %.0f MiB", r.BenchCPUSeconds, float64(r.BenchMaxRSSBytes)/(1<<20))
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "\n  error       %s", e)
	}
	b.WriteString("\n" + r.Placement.summary())
	return b.String()
}

func (c Config) validateCDN() error {
	switch {
	case c.Rate <= 0:
		return errors.New("bench: cdn needs a positive rate")
	case c.APIKey == "":
		return errors.New("bench: cdn needs the server API key")
	case c.Size < bodyHeader || c.Size > maxBodySize:
		return fmt.Errorf("bench: size must be %d to %d bytes, got %d", bodyHeader, maxBodySize, c.Size)
	case c.Batch < 0 || c.Batch > 100:
		return fmt.Errorf("bench: batch must be 1 to 100 messages, got %d", c.Batch)
	case c.Conns < 1 || c.Conns > 4096:
		return fmt.Errorf("bench: conns must be 1 to 4096, got %d", c.Conns)
	}
	return nil
}

// RunCDN pins a fresh room to CDN_MODE_BULK, starts a CDN edge (nginx) in front of the room's
// origin, publishes cfg.Rate bulk messages a second for cfg.Duration, and has cfg.N virtual
// viewers poll every whole window of the run through the edge. It reports the pusher's
// aggregation, the viewers' polls per window, the origin's requests per segment and the bytes
// per viewer against the long link's. The result is filled in as far as the run got, also with
// an error.
func RunCDN(ctx context.Context, cfg Config) (CDNResult, error) {
	cfg, err := cfg.withDefaults()
	if cfg.Conns == 0 {
		cfg.Conns = defaultConns
	}
	if cfg.Batch == 0 {
		cfg.Batch = min(max(int(cfg.Rate/50), 1), 100) // 50 requests a second
	}
	res := CDNResult{
		Scenario: "cdn", Viewers: cfg.N, Rate: cfg.Rate, Duration: cfg.Duration.Seconds(), Size: cfg.Size,
		Conns: cfg.Conns, Edge: "nginx", OriginRequests: -1,
	}
	if err != nil {
		return res, err
	}
	if err := cfg.validateCDN(); err != nil {
		return res, err
	}
	r, err := newRunner(cfg)
	defer r.stop()
	if err != nil {
		return res, err
	}
	res.Room = r.room

	r.progress("putting room %s in CDN mode", r.room)
	conf, err := cdnModeOn(ctx, r.hc, cfg, r.room)
	if err != nil {
		return res, err
	}
	res.WindowMS, res.PollJitterMS = conf.GetWindowMs(), conf.GetPollJitterMs()
	origin, err := url.Parse(conf.GetVendors()[0].GetUrlTemplate())
	if err != nil {
		return res, fmt.Errorf("bench: the room's vendor: %w", err)
	}

	// The edge, in front of a proxy that counts what reaches the origin.
	edgeBase := cfg.Edge
	var counter *originCounter
	if edgeBase == "" {
		counter, err = startOriginCounter(origin)
		if err != nil {
			return res, err
		}
		defer counter.close()
		dir, err := os.MkdirTemp("", "roomcast-bench-edge-")
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(dir)
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		edge, err := cdnedge.Start(ectx, cdnedge.Config{Origin: counter.addr, Dir: dir, Workers: cfg.EdgeWorkers, WorkerConnections: 2*cfg.Conns + 256})
		cancel()
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		defer edge.Close()
		edgeBase = edge.URL
	} else {
		res.Edge = edgeBase
	}
	edgeURL, err := url.Parse(edgeBase)
	if err != nil || edgeURL.Scheme != "http" {
		return res, fmt.Errorf("bench: the edge must be an http:// URL, got %q", edgeBase)
	}
	window := time.Duration(conf.GetWindowMs()) * time.Millisecond
	segPath := func(index int64) string {
		return segment.URL(origin.Path, cfg.App, r.room, conf.GetWindowMs(), index)
	}

	// What the viewers polled, one decoded segment per window, for the long-link comparison.
	var segMu sync.Mutex
	segs := map[int64]*clientpb.Segment{}
	var badSegments atomic.Int64
	w := int64(conf.GetWindowMs())
	var grace atomic.Int64 // ms; the SDK's guess until a segment's next_at_ms says
	grace.Store(w / 10)
	fleet := newViewerFleet(edgeURL.Host, edgeURL.Host, segPath, window, func(index int64, body []byte) {
		s, err := segment.Decode(body, segment.Want{App: cfg.App, Room: r.room, WindowMs: conf.GetWindowMs(), Index: index})
		if err != nil {
			badSegments.Add(1)
			return
		}
		if g := s.GetNextAtMs() - (index+2)*w; s.GetNextAtMs() > 0 && g >= 0 && g <= w {
			grace.Store(g)
		}
		segMu.Lock()
		segs[index] = s
		segMu.Unlock()
	})
	fctx, stopFleet := context.WithCancel(ctx)
	var fleetDone sync.WaitGroup
	fleetDone.Go(func() { fleet.run(fctx, cfg.Conns) })
	defer func() {
		stopFleet()
		fleetDone.Wait()
	}()

	before, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}
	pushBefore, err := r.pusherCounters(ctx)
	if err != nil {
		return res, err
	}
	pub := newPublisher(cfg.API, cfg.APIKey, r.room, "bulk", cfg.Size, r.id, tagging{}, cfg.Senders, cfg.Batch, tlsConfig(cfg.caPEM))
	pub.textPad = true
	start := time.Now()
	var pubDone sync.WaitGroup
	pubDone.Go(func() { pub.run(ctx, cfg.Rate, cfg.Duration, cfg.Senders) })

	// Every whole window of the publishing, polled by every viewer when it is due, as the SDK
	// polls: its end, the pusher's grace (from next_at_ms), a tenth of a window more for the
	// pusher to store it, plus the viewer's jitter.
	first := segment.Index(start.UnixMilli(), conf.GetWindowMs()) + 1
	last := segment.Index(start.Add(cfg.Duration).UnixMilli(), conf.GetWindowMs()) - 1
	jitter := time.Duration(conf.GetPollJitterMs()) * time.Millisecond
	pollStart := time.Now()
	for i := first; i <= last; i++ {
		due := time.UnixMilli((i+1)*w + grace.Load() + w/10)
		r.progress("window %d/%d: %d polls, %d hits, %d misses", i-first+1, last-first+1, fleet.requests.Load(), fleet.hits.Load(), fleet.misses.Load())
		fleet.schedule(ctx, cfg.N, i, due, jitter)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	res.Windows = int(max(last-first+1, 0))
	// The last polls and their retries.
	deadline := time.Now().Add(window*maxPollTries/5 + 10*time.Second)
	for fleet.pending.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	pollSpan := time.Since(pollStart)
	pubDone.Wait()
	stopFleet()
	fleetDone.Wait()

	after, err := r.server.read(ctx)
	if err != nil {
		return res, err
	}
	pushAfter, err := r.pusherCounters(ctx)
	if err != nil {
		return res, err
	}
	res.Published, res.PublishFailed = pub.ok.len(), pub.failed
	if span := pub.last.Sub(pub.first).Seconds(); span > 0 {
		res.PublishedPerSec = float64(pub.sent) / span
	}
	res.PusherMessagesPerSec = (pushAfter[0] - pushBefore[0]) / cfg.Duration.Seconds()
	res.PusherSampled = pushAfter[1] - pushBefore[1]
	res.SegmentsWritten = pushAfter[2] - pushBefore[2]
	res.SegmentBytes = pushAfter[3] - pushBefore[3]
	res.ServerCPUSeconds = after.cpu - before.cpu
	res.Placement = r.placement(before, after)

	res.Polls, res.Hits, res.Misses = fleet.requests.Load(), fleet.hits.Load(), fleet.misses.Load()
	res.Failures, res.GaveUp = fleet.failures.Load(), fleet.gaveUp.Load()
	if res.Windows > 0 {
		res.PollsPerViewerPerWindow = float64(res.Polls) / float64(cfg.N) / float64(res.Windows)
		viewerSeconds := float64(cfg.N) * float64(res.Windows) * window.Seconds()
		res.BytesPerViewerPerSec = float64(fleet.wireBytes.Load()) / viewerSeconds
	}
	res.PollsPerSec = float64(res.Polls) / pollSpan.Seconds()
	if counter != nil {
		res.OriginRequests, res.OriginMaxPerSegment = counter.segments(segPath, first, last)
		if res.Windows > 0 {
			res.OriginRequestsPerSegment = float64(res.OriginRequests) / float64(res.Windows)
		}
	}
	var messages, longLink int64
	for _, s := range segs {
		messages += int64(len(s.GetMessages()))
		longLink += longLinkBytes(s.GetMessages())
	}
	if len(segs) > 0 {
		res.SegmentMessages = float64(messages) / float64(len(segs))
		res.LongLinkBytesPerViewerPerSec = float64(longLink) / float64(len(segs)) / window.Seconds()
	}
	fleet.mu.Lock()
	res.PollLateP50MS, res.PollLateP99MS, res.PollLateMaxMS = quantiles(fleet.late.Export())
	res.Errors = append(res.Errors, fleet.errs...)
	fleet.mu.Unlock()
	if n := badSegments.Load(); n > 0 {
		res.Errors = append(res.Errors, fmt.Sprintf("%d segments did not decode", n))
	}
	if missing := res.Windows - len(segs); missing > 0 {
		res.Errors = append(res.Errors, fmt.Sprintf("%d windows had no segment", missing))
	}
	res.Errors = append(res.Errors, pub.errors...)
	res.Errors = res.Errors[:min(len(res.Errors), maxErrors)]
	res.BenchCPUSeconds, res.BenchMaxRSSBytes = selfUsage()
	return res, nil
}

// cdnModeOn pins room to CDN_MODE_BULK and waits until that mode is in force (a pusher writes
// the room), returning the config members get.
func cdnModeOn(ctx context.Context, hc *http.Client, cfg Config, room string) (*clientpb.CdnConfig, error) {
	path := "/v1/rooms/" + url.PathEscape(room) + "/cdn"
	if err := apiCall(ctx, hc, cfg.API, cfg.APIKey, http.MethodPut, path, map[string]any{"mode": "CDN_MODE_BULK"}, nil); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var state struct {
			Mode   string          `json:"mode"`
			Pusher string          `json:"pusher"`
			Config json.RawMessage `json:"config"`
		}
		if err := apiCall(ctx, hc, cfg.API, cfg.APIKey, http.MethodGet, path, nil, &state); err != nil {
			return nil, err
		}
		if state.Mode == "CDN_MODE_BULK" && state.Pusher != "" {
			var conf cdnConfigJSON
			if err := json.Unmarshal(state.Config, &conf); err != nil {
				return nil, fmt.Errorf("bench: the room's CDN config: %w", err)
			}
			if conf.WindowMs == 0 || len(conf.Vendors) == 0 {
				return nil, fmt.Errorf("bench: the room's CDN config has no window or vendor: %s", state.Config)
			}
			c := &clientpb.CdnConfig{Mode: clientpb.CdnMode_CDN_MODE_BULK, WindowMs: conf.WindowMs, PollIntervalMs: conf.PollIntervalMs, PollJitterMs: conf.PollJitterMs}
			for _, v := range conf.Vendors {
				c.Vendors = append(c.Vendors, &clientpb.CdnVendor{UrlTemplate: v.URLTemplate, Weight: v.Weight})
			}
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench: room %s not in CDN mode after 15s (mode %s, pusher %q): is a CDN pusher running?", room, state.Mode, state.Pusher)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cdnConfigJSON is a CdnConfig as the server API's JSON spells it.
type cdnConfigJSON struct {
	WindowMs       uint32 `json:"window_ms"`
	PollIntervalMs uint32 `json:"poll_interval_ms"`
	PollJitterMs   uint32 `json:"poll_jitter_ms"`
	Vendors        []struct {
		URLTemplate string `json:"url_template"`
		Weight      uint32 `json:"weight"`
	} `json:"vendors"`
}

// apiCall calls the server API at api and decodes its answer into out (when not nil).
func apiCall(ctx context.Context, hc *http.Client, api, apiKey, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, api+path, rd)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("bench: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("bench: %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(answer))
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			return fmt.Errorf("bench: %s %s: %w", method, path, err)
		}
	}
	return nil
}

// pusherCounters reads the pusher's messages, sampled, segments and bytes counters.
func (r *runner) pusherCounters(ctx context.Context) ([4]float64, error) {
	var out [4]float64
	text, err := r.server.scrape(ctx)
	if err != nil {
		return out, err
	}
	samples := parseMetrics(text)
	for i, name := range []string{metricPusherMessages, metricPusherSampled, metricPusherSegments, metricPusherBytes} {
		out[i], _ = sum(samples, name, nil)
	}
	return out, nil
}

// originCounter is a reverse proxy in front of the origin that counts the requests reaching it,
// by path.
type originCounter struct {
	addr      string
	srv       *http.Server
	transport *http.Transport // to the origin
	done      chan struct{}

	mu   sync.Mutex // guards hits
	hits map[string]int64
}

func startOriginCounter(origin *url.URL) (*originCounter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	c := &originCounter{addr: ln.Addr().String(), hits: map[string]int64{}, done: make(chan struct{}), transport: &http.Transport{}}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: origin.Scheme, Host: origin.Host})
	proxy.Transport = c.transport
	c.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c.mu.Lock()
		c.hits[req.URL.Path]++
		c.mu.Unlock()
		proxy.ServeHTTP(w, req)
	})}
	go func() {
		defer close(c.done)
		_ = c.srv.Serve(ln)
	}()
	return c, nil
}

// segments returns the origin requests for windows first to last and the most for one.
func (c *originCounter) segments(path func(int64) string, first, last int64) (total, most int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := first; i <= last; i++ {
		n := c.hits[path(i)]
		total += n
		most = max(most, n)
	}
	return total, most
}

func (c *originCounter) close() {
	_ = c.srv.Close()
	<-c.done
	c.transport.CloseIdleConnections()
}

// longLinkBytes is what the long link would spend on msgs: Push frames of the messages of each
// flush tick, each in a WebSocket frame.
func longLinkBytes(msgs []*clientpb.Message) int64 {
	byTick := map[int64][]*clientpb.Message{}
	for _, m := range msgs {
		t := m.GetServerTimeMs() / longLinkTick
		byTick[t] = append(byTick[t], m)
	}
	var total int64
	for _, ms := range byTick {
		n := proto.Size(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: ms}}})
		header := 2
		switch {
		case n >= 1<<16:
			header = 10
		case n >= 126:
			header = 4
		}
		total += int64(n + header)
	}
	return total
}
