// Package dispatcher is the central scheduler: it answers "which ChatLink should this client
// use?" with a ranked list of nodes. It learns about nodes from their load reports on NATS.
//
// What exists now is the walking skeleton: a node is live while it reports (one missed for
// three report intervals is out), a draining node gets no clients, and nodes are ranked by
// their reported connections plus the clients handed to them since that report, so a burst of
// dispatches spreads instead of landing on the node that looked emptiest. Geo/ISP scoring,
// slow start and ranking caches come with the dispatcher work.
package dispatcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// Config configures a dispatcher.
type Config struct {
	// Bus is the NATS connection load reports arrive on. Required.
	Bus *nats.Conn
	// StaleAfter is how long a node stays live without a report. Zero value means 3s.
	StaleAfter time.Duration
	// TopK is how many nodes an answer lists. Zero value means 3.
	TopK int
	// TTL is how long a client may reuse an answer. Zero value means 30s.
	TTL time.Duration
	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
	// Log receives the dispatcher's logs. Zero value means none.
	Log *slog.Logger
}

// Endpoint is one ChatLink as a client sees it.
type Endpoint struct {
	Node    string `json:"node"`
	WSURL   string `json:"ws_url"`
	TCPAddr string `json:"tcp_addr"`
}

// Answer is the reply to a dispatch request.
type Answer struct {
	Nodes []Endpoint `json:"nodes"`
	TTLMS int64      `json:"ttl_ms"`
}

// ErrNoNodes is returned by Dispatch when no live node takes clients.
var ErrNoNodes = errors.New("dispatcher: no ChatLink available")

// Dispatcher ranks ChatLinks for clients.
type Dispatcher struct {
	cfg Config
	log *slog.Logger
	sub *nats.Subscription

	mu    sync.Mutex // guards nodes
	nodes map[string]*nodeState
}

type nodeState struct {
	report   *pb.LoadReport
	seen     time.Time
	assigned int64 // clients handed out since the last report
}

// New returns a dispatcher; Start subscribes it to load reports.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Bus == nil {
		return nil, errors.New("dispatcher: Config.Bus is required")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 3 * time.Second
	}
	if cfg.TopK <= 0 {
		cfg.TopK = 3
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{cfg: cfg, log: log.With("svc", "dispatcher"), nodes: make(map[string]*nodeState)}, nil
}

// Start subscribes to load reports.
func (d *Dispatcher) Start() error {
	sub, err := d.cfg.Bus.Subscribe(bus.SubjectLoad, d.onReport)
	if err != nil {
		return fmt.Errorf("dispatcher: subscribe: %w", err)
	}
	d.sub = sub
	return d.cfg.Bus.Flush()
}

// Close unsubscribes. It may be called more than once.
func (d *Dispatcher) Close() {
	if d.sub != nil {
		_ = d.sub.Unsubscribe()
	}
}

func (d *Dispatcher) onReport(msg *nats.Msg) {
	var r pb.LoadReport
	if err := proto.Unmarshal(msg.Data, &r); err != nil {
		d.log.Warn("dropping load report that does not parse", "err", err)
		return
	}
	if r.Node == "" || r.WsUrl == "" || r.Connections < 0 {
		d.log.Warn("dropping load report with missing or absurd values", "node", r.Node)
		return
	}
	d.mu.Lock()
	d.nodes[r.Node] = &nodeState{report: &r, seen: d.cfg.Now()}
	d.mu.Unlock()
}

// Dispatch ranks the live nodes and returns the best TopK, counting the client against the
// first one until that node's next report.
func (d *Dispatcher) Dispatch() (Answer, error) {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	live := make([]*nodeState, 0, len(d.nodes))
	for name, n := range d.nodes {
		switch {
		case now.Sub(n.seen) > d.cfg.StaleAfter:
			delete(d.nodes, name)
		case !n.report.Draining:
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return Answer{}, ErrNoNodes
	}
	slices.SortFunc(live, func(a, b *nodeState) int {
		if c := cmpLoad(a, b); c != 0 {
			return c
		}
		return strings.Compare(a.report.Node, b.report.Node)
	})
	live = live[:min(len(live), d.cfg.TopK)]
	live[0].assigned++
	ans := Answer{Nodes: make([]Endpoint, len(live)), TTLMS: d.cfg.TTL.Milliseconds()}
	for i, n := range live {
		ans.Nodes[i] = Endpoint{Node: n.report.Node, WSURL: n.report.WsUrl, TCPAddr: n.report.TcpAddr}
	}
	return ans, nil
}

// cmpLoad orders nodes by predicted load: reported connections plus clients assigned since,
// relative to capacity when the node reports one.
func cmpLoad(a, b *nodeState) int {
	la, lb := predicted(a), predicted(b)
	switch {
	case la < lb:
		return -1
	case la > lb:
		return 1
	}
	return 0
}

func predicted(n *nodeState) float64 {
	load := float64(n.report.Connections + n.assigned)
	if max := n.report.MaxConnections; max > 0 {
		return load / float64(max)
	}
	return load / math.MaxInt32
}

// Nodes returns the live nodes' latest reports.
func (d *Dispatcher) Nodes() []*pb.LoadReport {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*pb.LoadReport, 0, len(d.nodes))
	for _, n := range d.nodes {
		if now.Sub(n.seen) <= d.cfg.StaleAfter {
			out = append(out, n.report)
		}
	}
	slices.SortFunc(out, func(a, b *pb.LoadReport) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// ServeHTTP answers GET /v1/dispatch.
func (d *Dispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	ans, err := d.Dispatch()
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(ans)
}
