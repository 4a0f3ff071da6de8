// Package console is the ops console at /console: one static page and its JSON endpoints under
// /v1/console/ (the dispatcher's nodes, an app's busiest rooms with their CDN modes, and the
// last minutes of every node's load reports, kept in a small ring per node, with the rates of
// its deliveries and drops per lane). It only reads: moderation from the page goes through the
// server API's own routes. It must not be served where the server API's keys are not checked:
// every JSON endpoint goes through Config.Guard.
package console

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
)

//go:embed index.html
var page []byte

// Config configures the console.
type Config struct {
	// Bus is where the nodes' load reports arrive (bus.SubjectLoad). Required.
	Bus *nats.Conn
	// Guard checks a request's API key (it must have the admin scope) and calls next with the
	// app the key acts for, or answers the refusal itself. Required.
	Guard func(next func(w http.ResponseWriter, r *http.Request, app string)) http.Handler
	// Nodes returns the dispatcher's view of the nodes (dispatcher.Nodes), served as is. Required.
	Nodes func() any
	// RoomCdn returns a room's CDN settings (the server API's GetRoomCdn). Nil: rooms show no
	// CDN mode.
	RoomCdn func(ctx context.Context, app, room string) (*apipb.RoomCdn, error)
	// FlowT1 and FlowT2 are the ChatLinks' flow-control thresholds as shares of their egress
	// capacity, which the load reports do not carry; the egress charts draw them. Zero values
	// mean not drawn.
	FlowT1, FlowT2 float64
	// Window is how much of each node's history the charts get. Zero value means 5 minutes.
	Window time.Duration
	// MaxRooms is how many rooms /v1/console/rooms lists, the most members first. Zero value
	// means 50.
	MaxRooms int
	// Log records reports that cannot be decoded. Zero value means discard.
	Log *slog.Logger
	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil || c.Guard == nil || c.Nodes == nil {
		return c, errors.New("console: Bus, Guard and Nodes are required")
	}
	if c.Window <= 0 {
		c.Window = 5 * time.Minute
	}
	if c.MaxRooms <= 0 {
		c.MaxRooms = 50
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Sample is one load report of a node, as the charts draw it.
type Sample struct {
	TimeMs         int64   `json:"t"`
	Connections    int64   `json:"connections"`
	Rooms          int64   `json:"rooms"`
	EgressBytes    int64   `json:"egress_bytes_per_sec"`
	EgressCapacity int64   `json:"egress_capacity_bytes_per_sec"`
	FlowControl    float64 `json:"flow_control_strength"`
	CPU            float64 `json:"cpu"`
	BusRTTMicros   int64   `json:"bus_rtt_us"`
	MaxConnections int64   `json:"max_connections"`
	Draining       bool    `json:"draining"`
	// Lanes are the node's deliveries and drops per second since its previous report, by lane
	// ("critical", "normal", "bulk"); absent from a node's first report and from reports
	// without lane counts.
	Lanes map[string]LaneRates `json:"lanes,omitempty"`
}

// LaneRates are one lane's messages per second on a node: written to members' connections,
// and left out of members' streams by the room's budget, by flow control, or for reading too
// slowly.
type LaneRates struct {
	Deliveries       float64 `json:"deliveries"`
	DropsBudget      float64 `json:"drops_budget"`
	DropsFlowControl float64 `json:"drops_flow_control"`
	DropsSlowReader  float64 `json:"drops_slow_reader"`
}

// laneRates returns the rates per lane between two reports' counters, taken elapsed apart.
// A counter lower than before means the node restarted: all of its count is new.
func laneRates(prev, cur []*buspb.LaneCounters, elapsed time.Duration) map[string]LaneRates {
	if len(prev) == 0 || len(cur) == 0 || elapsed <= 0 {
		return nil
	}
	rate := func(was, is int64) float64 {
		if is < was {
			was = 0
		}
		return float64(is-was) / elapsed.Seconds()
	}
	out := make(map[string]LaneRates, len(cur))
	for _, c := range cur {
		i := slices.IndexFunc(prev, func(p *buspb.LaneCounters) bool { return p.Lane == c.Lane })
		if i < 0 {
			continue
		}
		p := prev[i]
		out[strings.ToLower(strings.TrimPrefix(c.Lane.String(), "LANE_"))] = LaneRates{
			Deliveries:       rate(p.Deliveries, c.Deliveries),
			DropsBudget:      rate(p.DropsBudget, c.DropsBudget),
			DropsFlowControl: rate(p.DropsFlowControl, c.DropsFlowControl),
			DropsSlowReader:  rate(p.DropsSlowReader, c.DropsSlowReader),
		}
	}
	return out
}

// nodeState is what the console keeps of one node.
type nodeState struct {
	samples []Sample           // oldest first, at most Window old
	rooms   []*buspb.RoomCount // the last report's rooms_held
	partial bool               // the last report left rooms out
	seen    time.Time
	lanes   []*buspb.LaneCounters // the last report's lane counts
	lanesAt int64                 // and its time_ms
}

// Console serves the ops console.
type Console struct {
	cfg Config
	sub *nats.Subscription

	dropped int64 // reports that did not decode; guarded by mu

	mu    sync.Mutex // guards the fields below
	nodes map[string]*nodeState
}

// New subscribes to the load reports and returns the console.
func New(cfg Config) (*Console, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, nodes: make(map[string]*nodeState)}
	if c.sub, err = cfg.Bus.Subscribe(bus.SubjectLoad, c.onReport); err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops taking reports. It may be called twice.
func (c *Console) Close() {
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
}

func (c *Console) onReport(msg *nats.Msg) {
	var r buspb.LoadReport
	if err := proto.Unmarshal(msg.Data, &r); err != nil || r.Node == "" {
		c.mu.Lock()
		c.dropped++
		c.mu.Unlock()
		c.cfg.Log.Warn("console: load report dropped", "err", err)
		return
	}
	c.record(&r)
}

// record adds report r to its node's ring and forgets what is older than the window.
func (c *Console) record(r *buspb.LoadReport) {
	now := c.cfg.Now()
	s := Sample{
		TimeMs: now.UnixMilli(), Connections: r.Connections, Rooms: r.Rooms,
		EgressBytes: r.EgressBytesPerSec, EgressCapacity: r.EgressCapacityBytesPerSec,
		FlowControl: r.FlowControlStrength, CPU: r.Cpu, BusRTTMicros: r.BusRttUs,
		MaxConnections: r.MaxConnections, Draining: r.Draining,
	}
	oldest := now.Add(-c.cfg.Window).UnixMilli()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[r.Node]
	if n == nil {
		n = &nodeState{}
		c.nodes[r.Node] = n
	}
	n.samples = append(n.samples, s)
	i := 0
	for i < len(n.samples) && n.samples[i].TimeMs < oldest {
		i++
	}
	n.samples = slices.Delete(n.samples, 0, i)
	n.rooms, n.partial, n.seen = r.RoomsHeld, r.RoomsHeldPartial, now
	n.samples[len(n.samples)-1].Lanes = laneRates(n.lanes, r.Lanes, time.Duration(r.TimeMs-n.lanesAt)*time.Millisecond)
	n.lanes, n.lanesAt = r.Lanes, r.TimeMs
	for name, o := range c.nodes {
		if o.seen.UnixMilli() < oldest {
			delete(c.nodes, name)
		}
	}
}

// Register serves GET /console and the JSON endpoints under /v1/console/ on mux.
func (c *Console) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /console", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(page)
	})
	mux.Handle("GET /v1/console/nodes", c.cfg.Guard(c.serveNodes))
	mux.Handle("GET /v1/console/rooms", c.cfg.Guard(c.serveRooms))
	mux.Handle("GET /v1/console/series", c.cfg.Guard(c.serveSeries))
}

func (c *Console) serveNodes(w http.ResponseWriter, _ *http.Request, _ string) {
	writeJSON(w, map[string]any{"nodes": c.cfg.Nodes()})
}

// Series is the answer of GET /v1/console/series.
type Series struct {
	WindowMs int64 `json:"window_ms"`
	// FlowT1 and FlowT2 are Config's: shares of each sample's egress capacity.
	FlowT1 float64             `json:"flow_t1"`
	FlowT2 float64             `json:"flow_t2"`
	Nodes  map[string][]Sample `json:"nodes"`
	// Dropped counts the load reports that did not decode since the start.
	Dropped int64 `json:"dropped_reports"`
}

func (c *Console) serveSeries(w http.ResponseWriter, _ *http.Request, _ string) {
	out := Series{WindowMs: c.cfg.Window.Milliseconds(), FlowT1: c.cfg.FlowT1, FlowT2: c.cfg.FlowT2, Nodes: make(map[string][]Sample)}
	c.mu.Lock()
	for name, n := range c.nodes {
		out.Nodes[name] = slices.Clone(n.samples)
	}
	out.Dropped = c.dropped
	c.mu.Unlock()
	writeJSON(w, out)
}

// Room is one room of GET /v1/console/rooms.
type Room struct {
	Room   string           `json:"room"`
	Online int64            `json:"online"`
	Nodes  map[string]int64 `json:"nodes"`
	// CdnMode is the mode in force (CDN_MODE_...), CdnAutomatic whether the rules decide it;
	// CdnError says why they could not be read.
	CdnMode      string `json:"cdn_mode,omitempty"`
	CdnAutomatic bool   `json:"cdn_automatic"`
	CdnError     string `json:"cdn_error,omitempty"`
}

// serveRooms lists the app's rooms as the nodes last reported them (each node lists its
// busiest 1,000), the most members first.
func (c *Console) serveRooms(w http.ResponseWriter, r *http.Request, app string) {
	rooms := map[string]*Room{}
	partial := false
	c.mu.Lock()
	for name, n := range c.nodes {
		partial = partial || n.partial
		for _, rc := range n.rooms {
			if rc.App != app || rc.Members <= 0 {
				continue
			}
			rm := rooms[rc.Room]
			if rm == nil {
				rm = &Room{Room: rc.Room, Nodes: map[string]int64{}}
				rooms[rc.Room] = rm
			}
			rm.Online += rc.Members
			rm.Nodes[name] += rc.Members
		}
	}
	c.mu.Unlock()
	list := make([]*Room, 0, len(rooms))
	for _, rm := range rooms {
		list = append(list, rm)
	}
	slices.SortFunc(list, func(a, b *Room) int {
		return cmp.Or(cmp.Compare(b.Online, a.Online), cmp.Compare(a.Room, b.Room))
	})
	if len(list) > c.cfg.MaxRooms {
		list = list[:c.cfg.MaxRooms]
	}
	if c.cfg.RoomCdn != nil {
		for _, rm := range list {
			cdn, err := c.cfg.RoomCdn(r.Context(), app, rm.Room)
			if err != nil {
				rm.CdnError = err.Error()
				continue
			}
			rm.CdnMode, rm.CdnAutomatic = cdn.Mode.String(), cdn.Automatic
		}
	}
	writeJSON(w, map[string]any{"app": app, "rooms": list, "partial": partial})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
