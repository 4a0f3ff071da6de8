package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"roomcast/proto/clientpb"
)

// publisher sends the bench's messages to a room through the server API, paced at a rate, with
// several senders on keep-alive connections so that the sender is not the bottleneck.
type publisher struct {
	url    string // POST target
	room   string
	apiKey string
	lane   string // critical, normal, bulk or mix
	size   int
	id     runID
	tags   tagging // chooses each message's tag expression
	batch  int     // messages per request; more than 1 uses the batch send
	hc     *http.Client
	// textPad pads bodies with random letters instead of 'x', so that they compress like text
	// (bench cdn compares compressed segments with the long link).
	textPad bool

	mu      sync.Mutex // guards the fields below
	ok      seqSet     // the accepted messages
	failed  int64
	errors  []string
	first   time.Time // first send
	last    time.Time // last answer
	sent    int64
	latency *hdrhistogram.Histogram // request to answer, µs
}

func newPublisher(api, apiKey, room, lane string, size int, run runID, tags tagging, senders, batch int, tlsCfg *tls.Config) *publisher {
	return &publisher{
		url: api + "/v1/rooms/" + url.PathEscape(room) + "/messages", room: room, apiKey: apiKey, lane: lane, size: size, id: run, tags: tags,
		batch:   max(1, batch),
		latency: newLatencyHistogram(),
		hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			MaxIdleConns: senders, MaxIdleConnsPerHost: senders, MaxConnsPerHost: senders, IdleConnTimeout: 30 * time.Second,
			TLSClientConfig: tlsCfg,
		}},
	}
}

// laneOf is the lane of message seq.
func (p *publisher) laneOf(seq uint64) string {
	if p.lane != "mix" {
		return p.lane
	}
	return [...]string{"critical", "normal", "bulk"}[seq%3]
}

// run publishes rate messages per second for d with senders concurrent senders, and returns
// once every message has been answered.
func (p *publisher) run(ctx context.Context, rate float64, d time.Duration, senders int) {
	total := int64(rate * d.Seconds())
	jobs := make(chan []uint64, senders)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for seqs := range jobs {
				p.send(ctx, seqs)
			}
		})
	}
	pace := newPacer(rate)
	defer pace.stop()
	for k := int64(0); k < total; k += int64(p.batch) {
		if !pace.wait(ctx, k) {
			break
		}
		seqs := make([]uint64, 0, p.batch)
		for seq := k; seq < min(k+int64(p.batch), total); seq++ {
			seqs = append(seqs, uint64(seq))
		}
		jobs <- seqs
	}
	close(jobs)
	wg.Wait()
	p.hc.CloseIdleConnections()
}

// pacer times a publisher's messages: message k is due k/rate seconds after the first.
type pacer struct {
	start time.Time
	rate  float64
	timer *time.Timer
}

func newPacer(rate float64) *pacer {
	p := &pacer{start: time.Now(), rate: rate, timer: time.NewTimer(0)}
	<-p.timer.C
	return p
}

// wait waits until message k is due, and reports false if ctx ended first.
func (p *pacer) wait(ctx context.Context, k int64) bool {
	due := p.start.Add(time.Duration(float64(k) / p.rate * float64(time.Second)))
	if w := time.Until(due); w > 0 {
		p.timer.Reset(w)
		select {
		case <-ctx.Done():
		case <-p.timer.C:
		}
	}
	return ctx.Err() == nil
}

func (p *pacer) stop() { p.timer.Stop() }

type apiSend struct {
	Type       string `json:"type"`
	Lane       string `json:"lane"`
	BodyBase64 []byte `json:"body_base64"`
	TagExpr    string `json:"tag_expr,omitempty"`
}

// send publishes the messages seqs in one request: the single send for one message, the batch
// send (all or none) for more.
func (p *publisher) send(ctx context.Context, seqs []uint64) {
	now := time.Now()
	msgs := make([]apiSend, len(seqs))
	for i, seq := range seqs {
		msgs[i] = apiSend{
			Type: "bench", Lane: p.laneOf(seq), BodyBase64: appendBody(nil, p.id, seq, now.UnixNano(), p.size),
			TagExpr: p.tags.target(seq).expr(),
		}
		if p.textPad {
			randomText(msgs[i].BodyBase64[bodyHeader:])
		}
	}
	var err error
	if len(msgs) == 1 {
		b, _ := json.Marshal(msgs[0])
		err = p.post(ctx, p.url, b)
	} else {
		b, _ := json.Marshal(struct {
			Messages []apiSend `json:"messages"`
		}{msgs})
		err = p.post(ctx, p.url+"/batch", b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first.IsZero() || now.Before(p.first) {
		p.first = now
	}
	p.last = time.Now()
	p.sent += int64(len(seqs))
	recordLatency(p.latency, p.last.Sub(now))
	if err != nil {
		p.failed += int64(len(seqs))
		if len(p.errors) < maxErrors {
			p.errors = append(p.errors, fmt.Sprintf("messages %d-%d: %v", seqs[0], seqs[len(seqs)-1], err))
		}
		return
	}
	for _, seq := range seqs {
		p.ok.add(seq)
	}
}

func laneValue(lane string) clientpb.Lane {
	switch lane {
	case "critical":
		return clientpb.Lane_LANE_CRITICAL
	case "bulk":
		return clientpb.Lane_LANE_BULK
	}
	return clientpb.Lane_LANE_NORMAL
}

func (p *publisher) post(ctx context.Context, target string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+p.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096)) // read to the end: keep-alive
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(answer))
	}
	return nil
}

// putSettings creates the room if need be and sets its delivery settings through the server
// API (POST /v1/rooms is idempotent; PATCH replaces the settings of an existing room).
func putSettings(ctx context.Context, hc *http.Client, api, apiKey, room string, s roomSettings) error {
	if err := apiCall(ctx, hc, api, apiKey, http.MethodPost, "/v1/rooms", map[string]any{"room": room, "settings": s}, nil); err != nil {
		return err
	}
	return apiCall(ctx, hc, api, apiKey, http.MethodPatch, "/v1/rooms/"+url.PathEscape(room), map[string]any{"settings": s}, nil)
}

// roomSettings is the JSON of a room's settings in the server API (RoomSettings, proto/room.proto).
type roomSettings struct {
	FlushTickMS     uint32 `json:"flush_tick_ms"`
	LatencyBudgetMS uint32 `json:"latency_budget_ms,omitempty"`
	NoMerge         bool   `json:"no_merge"`
	NormalBudget    int32  `json:"normal_budget"`
	CriticalBudget  int32  `json:"critical_budget"`
	BulkPerSecond   int32  `json:"bulk_per_second"`
}
