// Package dispatcher is the central scheduler: it answers "which ChatLinks should this client
// use?" with a ranked list of nodes and a TTL, over HTTP/JSON and gRPC.
//
// It learns about nodes from their load reports on NATS (a node missing three reports is out,
// a draining node gets no clients), locates clients with GeoIP2 City/Country and ISP/ASN
// databases, and scores every node for the client: region match, ISP match, spare connections
// and egress, flow control, CPU and link quality (docs/dispatch.md). Between two reports each
// client it hands out counts against the node it chose, and a node that has just (re)joined
// fills its capacity over a slow-start window, so a flash crowd spreads instead of landing on
// the node that looked emptiest. Rankings are cached per (region, ISP) bucket; the cache keeps
// the candidates, not the choice, so cached decisions still see every assignment. Members of
// a room go to the nodes that hold it, up to a share of each node's capacity (room affinity,
// rooms.go), after capacity and locality. A near-region list orders other continents' nodes
// for a region's clients (labels.go), and event pools keep a reserved app's or room's clients
// on the pool's nodes and everyone else off them (pools.go).
//
// It keeps no state that must survive it: everything it knows comes back with the next round
// of load reports. It must not talk to clients beyond answering where to go.
package dispatcher

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
)

// Config configures a dispatcher. Zero values are defaults; Weights and the ISP table are
// documented in docs/dispatch.md.
type Config struct {
	// Bus is the NATS connection load reports arrive on. Required.
	Bus *nats.Conn
	// StaleAfter is how long a node that does not report its report interval stays live
	// without a report; nodes that do are out after three missed reports. Zero value means 3s.
	StaleAfter time.Duration
	// TopK is how many nodes an answer lists, at most 16. Zero value means 3.
	TopK int
	// TTL is how long a client may reuse an answer. Zero value means 30s.
	TTL time.Duration

	// CityDB is the path of a GeoIP2/GeoLite2 City (or Country) database: the client's region.
	// Zero value means none: clients are not placed by region.
	CityDB string
	// ISPDB is the path of a GeoIP2 ISP or GeoLite2 ASN database: the client's ISP. Zero value
	// means none: clients are not matched by ISP.
	ISPDB string
	// GeoCheckInterval is how often the database files are checked for a change, which
	// reloads them. Zero value means 10s; negative means never (Reload or SIGHUP only).
	GeoCheckInterval time.Duration
	// ReloadOnSIGHUP reloads the databases when the process gets SIGHUP. Zero value means
	// SIGHUP is not watched.
	ReloadOnSIGHUP bool
	// TrustedProxies are the addresses or CIDRs of proxies whose X-Forwarded-For and X-Real-IP
	// headers (x-forwarded-for / x-real-ip gRPC metadata) name the client. Zero value means
	// none: the client is always the connection's peer.
	TrustedProxies []string
	// ISPGroups is the ISP-equivalence table: group name -> members, each an ASN ("AS4837"),
	// an ISP name, or a name prefix ending in '*'. Nil means DefaultISPGroups(); an empty map
	// means no groups.
	ISPGroups map[string][]string

	// Weights are the scoring weights. The zero value means DefaultWeights().
	Weights Weights
	// NearEqual is the score margin within which nodes are picked at random (weighted by
	// score) rather than strictly best first. Zero value means 2; negative means never.
	NearEqual float64
	// SlowStart is the window over which a node that has just joined or come back grows from
	// 5% to all of its capacity. Zero value means 30s; negative means no slow start.
	SlowStart time.Duration
	// CacheTTL is how long a bucket's ranking is reused. Zero value means 1s; negative means
	// no cache.
	CacheTTL time.Duration
	// CacheBuckets bounds the number of cached rankings. Zero value means 10,000.
	CacheBuckets int
	// DefaultCapacity is the connection capacity assumed for a node that reports none.
	// Zero value means 100,000.
	DefaultCapacity int64
	// CPUFull is the CPU use at which a node counts as full. Zero value means 0.95.
	CPUFull float64
	// LinkRTT is the bus round trip at which a node's link quality is one half. Zero value
	// means 20ms.
	LinkRTT time.Duration
	// RoomShare is the share of a node's capacity (after slow start) one room may fill with
	// the members the dispatcher steers to it before the room's next members open another
	// node (docs/dispatch.md, "Room affinity"). Zero value means DefaultRoomShare; negative
	// means no room affinity: members are dispatched on locality and load alone.
	RoomShare float64
	// NearRegions orders, for clients of a region, the regions of other continents nearest
	// first: key and entries are region labels or prefixes ("AS", "AS/CN", "NA/US"), at most
	// maxNear (8) entries, none on the key's continent. A client takes the list of the most
	// specific key containing its region. Its own continent's nodes come first as always, then
	// the list's regions in order, then every other node (docs/dispatch.md, "Near regions").
	// Zero value means none: nodes on other continents are all "elsewhere", equally far.
	NearRegions map[string][]string
	// Pools reserves pools of ChatLinks (nodes whose load report carries the pool's label,
	// `roomcast chatlink --pool`) for one app or one room: its clients go only to the pool's
	// nodes and nobody else's ever do (docs/dispatch.md, "Event pools"). SetPools replaces them.
	// Zero value means none: a node's pool label changes nothing.
	Pools []PoolReservation

	// Now is the clock. Zero value means time.Now.
	Now func() time.Time
	// Registry receives the dispatcher's metrics. Zero value means none are registered.
	Registry prometheus.Registerer
	// Log receives the dispatcher's logs. Zero value means none.
	Log *slog.Logger
}

// DefaultRoomShare is Config.RoomShare's default, and `roomcast services`' --room-share's.
const DefaultRoomShare = 0.5

// Endpoint is one ChatLink as a client sees it.
type Endpoint struct {
	Node    string `json:"node"`
	WSURL   string `json:"ws_url"`
	TCPAddr string `json:"tcp_addr"`
	// TCPTLS says the TCP transport is TLS; left out of the JSON when false.
	TCPTLS bool `json:"tcp_tls,omitempty"`
}

// Answer is the reply to a dispatch request.
type Answer struct {
	Nodes []Endpoint `json:"nodes"`
	TTLMS int64      `json:"ttl_ms"`
}

// Request is what a dispatch decision depends on.
type Request struct {
	// Client is the client's address. The zero value, and addresses that cannot be located,
	// mean the client is dispatched on load alone.
	Client netip.Addr
	// App and Room are the room the client joins: its members are steered to the nodes that
	// hold it. Both or neither; empty means no room affinity.
	App, Room string
}

// check refuses a room that is not a valid name, or half a room.
func (r Request) check() error {
	switch {
	case r.App == "" && r.Room == "":
		return nil
	case r.App == "" || r.Room == "":
		return fmt.Errorf("%w: app and room go together", ErrBadRequest)
	case !auth.ValidName(r.App) || !auth.ValidName(r.Room):
		return fmt.Errorf("%w: app and room must be 1 to 128 characters of A-Z a-z 0-9 _ -", ErrBadRequest)
	}
	return nil
}

var (
	// ErrNoNodes is returned by Dispatch when no live node takes clients.
	ErrNoNodes = errors.New("dispatcher: no ChatLink available")
	// ErrBadRequest is returned by Dispatch for a request it cannot serve (a bad room name).
	ErrBadRequest = errors.New("dispatcher: bad request")
)

// errNoPoolNodes is ErrNoNodes for a client of a reserved pool: it is never sent outside it.
func errNoPoolNodes(pool string) error {
	return fmt.Errorf("%w: no node of pool %q, reserved for this room, is live and not draining", ErrNoNodes, pool)
}

const (
	maxTopK       = 16
	maxCandidates = 64
)

// Dispatcher ranks ChatLinks for clients.
type Dispatcher struct {
	cfg Config
	log *slog.Logger // cfg.Log, naming the service
	m   *metrics

	// Derived from cfg once, in New.
	hysteresis   float64 // how far a cached ranking's best may fall below its cutoff
	initialGrace time.Duration
	candidates   int // nodes kept per cached ranking
	classPoints  [numClasses]float64
	classOrder   [numClasses]uint8 // classes by points, best first
	maxQuality   float64           // the most a node's quality terms can add
	trusted      trustedProxies
	isps         *ispTable
	near         nearTable

	scratch sync.Pool // *[]uint8 for rank
	in      *interner
	geo     *geoLoader // nil without databases
	started int64      // unix ns

	mu        sync.Mutex // guards nodes and freeSlots; publishLive and sweep run with it held
	nodes     map[string]*node
	live      atomic.Pointer[liveSet] // the non-draining nodes, replaced whole under mu
	liveDirty atomic.Bool             // live is out of date; liveNodes rebuilds it
	gen       atomic.Uint64           // bumped when live changes; older rankings are rebuilt
	slots     atomic.Uint32           // node slots handed out (node.slot < slots); grows under mu
	freeSlots []uint32                // slots of nodes that went out, for the next new ones

	cache rankCache
	rooms roomTable
	pools atomic.Pointer[poolTable] // Config.Pools, replaced whole by SetPools

	sub       *nats.Subscription
	stop      chan struct{}
	wg        sync.WaitGroup // the database watcher
	closeOnce sync.Once
}

// withDefaults returns c with the zero values replaced by the documented defaults, or an error
// for a Config New cannot use. Negative NearEqual, SlowStart, CacheTTL and GeoCheckInterval
// stay negative: they mean "never" (see nearEqual and cacheTTL).
func (c Config) withDefaults() (Config, error) {
	if c.Bus == nil {
		return c, errors.New("dispatcher: Config.Bus is required")
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 3 * time.Second
	}
	switch {
	case c.TopK > maxTopK:
		return c, fmt.Errorf("dispatcher: TopK %d is more than %d", c.TopK, maxTopK)
	case c.TopK <= 0:
		c.TopK = 3
	}
	if c.TTL <= 0 {
		c.TTL = 30 * time.Second
	}
	if c.GeoCheckInterval == 0 {
		c.GeoCheckInterval = 10 * time.Second
	}
	if c.ISPGroups == nil {
		c.ISPGroups = DefaultISPGroups()
	}
	if c.Weights == (Weights{}) {
		c.Weights = DefaultWeights()
	}
	if err := c.Weights.validate(); err != nil {
		return c, err
	}
	switch {
	case math.IsNaN(c.NearEqual) || math.IsInf(c.NearEqual, 0):
		return c, errors.New("dispatcher: NearEqual must be a finite number")
	case c.NearEqual == 0:
		c.NearEqual = 2
	}
	if c.SlowStart == 0 {
		c.SlowStart = 30 * time.Second
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = time.Second
	}
	if c.CacheBuckets <= 0 {
		c.CacheBuckets = 10_000
	}
	if c.DefaultCapacity <= 0 {
		c.DefaultCapacity = 100_000
	}
	switch {
	case math.IsNaN(c.CPUFull) || c.CPUFull < 0 || c.CPUFull > 1:
		return c, fmt.Errorf("dispatcher: CPUFull %v must be between 0 and 1", c.CPUFull)
	case c.CPUFull == 0:
		c.CPUFull = 0.95
	}
	if c.LinkRTT <= 0 {
		c.LinkRTT = 20 * time.Millisecond
	}
	switch {
	case math.IsNaN(c.RoomShare) || c.RoomShare > 1:
		return c, fmt.Errorf("dispatcher: RoomShare %v must be at most 1", c.RoomShare)
	case c.RoomShare == 0:
		c.RoomShare = DefaultRoomShare
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// New checks cfg, opens the GeoIP databases it names and returns a dispatcher; Start
// subscribes it to load reports.
func New(cfg Config) (*Dispatcher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg: cfg, log: cfg.Log.With("svc", "dispatcher"),
		in: newInterner(), nodes: make(map[string]*node), stop: make(chan struct{}),
	}
	d.hysteresis = max(d.nearEqual(), 1) / 2
	d.cache.init(cfg.CacheBuckets)
	d.rooms.init()
	d.candidates = min(max(16, 4*cfg.TopK), maxCandidates)
	w := cfg.Weights
	d.maxQuality = w.SpareConnections + w.SpareEgress + w.FlowControl + w.CPU + w.Link
	for c := range numClasses {
		d.classPoints[c] = w.locality(matchLevel(c/2), c%2 == 1)
		d.classOrder[c] = uint8(c)
	}
	slices.SortStableFunc(d.classOrder[:], func(a, b uint8) int { return cmp.Compare(d.classPoints[b], d.classPoints[a]) })
	d.scratch.New = func() any { return new([]uint8) }
	// Nodes already serving when the dispatcher starts report within this window; they are
	// not new, so they skip slow start.
	d.initialGrace = max(cfg.StaleAfter, 3*time.Second)
	if d.trusted, err = parseTrustedProxies(cfg.TrustedProxies); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	if d.isps, err = newISPTable(cfg.ISPGroups); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	if d.near, err = newNearTable(d.in, cfg.NearRegions); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	d.started = d.now()
	if cfg.CityDB != "" || cfg.ISPDB != "" {
		if d.geo, err = newGeoLoader(cfg.CityDB, cfg.ISPDB, d.in, d.isps, cfg.Now()); err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	d.live.Store(&liveSet{})
	d.m = newMetrics(cfg.Registry, func() float64 { return float64(d.LiveNodes()) })
	pools, err := d.newPoolTable(cfg.Pools)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	d.pools.Store(pools)
	return d, nil
}

func (d *Dispatcher) now() int64 { return d.cfg.Now().UnixNano() }

// nearEqual is the score margin of random picks: Config.NearEqual, or 0 (never) when it is
// negative.
func (d *Dispatcher) nearEqual() float64 { return max(d.cfg.NearEqual, 0) }

// cacheTTL is how long a ranking is reused, in ns: Config.CacheTTL, or 0 (no cache) when it is
// negative.
func (d *Dispatcher) cacheTTL() int64 { return int64(max(d.cfg.CacheTTL, 0)) }

// Start subscribes to load reports and starts watching the GeoIP databases.
func (d *Dispatcher) Start() error {
	h := d.Health()
	if h.Mode == ModeLoadOnly {
		d.log.Warn("no GeoIP databases: clients are dispatched on load alone")
	} else {
		d.log.Info("dispatcher started", "mode", h.Mode, "city_db", d.cfg.CityDB, "isp_db", d.cfg.ISPDB)
	}
	sub, err := d.cfg.Bus.Subscribe(bus.SubjectLoad, d.onReport)
	if err != nil {
		return fmt.Errorf("dispatcher: subscribe: %w", err)
	}
	d.sub = sub
	d.watchGeo()
	return d.cfg.Bus.Flush()
}

// Close unsubscribes and stops the database watcher. It may be called more than once.
func (d *Dispatcher) Close() {
	d.closeOnce.Do(func() {
		if d.sub != nil {
			_ = d.sub.Unsubscribe()
		}
		close(d.stop)
		d.wg.Wait()
	})
}

// watchGeo starts reloading the databases when their files change or on SIGHUP. The signal
// is wired before it returns, so a SIGHUP right after Start is not lost.
func (d *Dispatcher) watchGeo() {
	if d.geo == nil || (d.cfg.GeoCheckInterval <= 0 && !d.cfg.ReloadOnSIGHUP) {
		return
	}
	var tick <-chan time.Time
	var ticker *time.Ticker
	if d.cfg.GeoCheckInterval > 0 {
		ticker = time.NewTicker(d.cfg.GeoCheckInterval)
		tick = ticker.C
	}
	var hup chan os.Signal
	if d.cfg.ReloadOnSIGHUP {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if ticker != nil {
			defer ticker.Stop()
		}
		if hup != nil {
			defer signal.Stop(hup)
		}
		for {
			select {
			case <-d.stop:
				return
			case <-tick:
				_ = d.reload(false)
			case <-hup:
				d.log.Info("SIGHUP: reloading GeoIP databases")
				_ = d.reload(true)
			}
		}
	}()
}

// Reload reopens the GeoIP databases now. A database that fails to load leaves the previous
// copy in service; the error says why and Health shows it until a reload succeeds. Requests
// are served throughout.
func (d *Dispatcher) Reload() error {
	if d.geo == nil {
		return nil
	}
	return d.reload(true)
}

func (d *Dispatcher) reload(force bool) error {
	var errs []error
	replaced := false
	for _, r := range d.geo.reload(force, d.cfg.Now()) {
		if r.err == nil {
			replaced = true
			d.m.geoReloads.WithLabelValues(r.kind.String(), "ok").Inc()
			d.log.Info("GeoIP database reloaded", "db", r.kind.String(), "path", r.path)
			continue
		}
		errs = append(errs, r.err)
		if r.news {
			// A file that stays broken is counted and logged once, not at every check.
			d.m.geoReloads.WithLabelValues(r.kind.String(), "error").Inc()
			d.log.Error("GeoIP database not reloaded; the previous copy stays in service", "db", r.kind.String(), "err", r.err)
		}
	}
	if replaced {
		// A new database may place clients differently: start the rankings afresh.
		d.cache.clear()
	}
	return errors.Join(errs...)
}

// Geo modes reported by Health.
const (
	ModeRegionISP = "region+isp"
	ModeRegion    = "region"
	ModeISP       = "isp"
	ModeLoadOnly  = "load-only"
)

// Health is the dispatcher's state for /healthz.
type Health struct {
	// Mode says what clients are placed by: region+isp, region, isp or load-only (no
	// databases: by load alone).
	Mode   string    `json:"mode"`
	Nodes  int       `json:"nodes"`
	CityDB *DBStatus `json:"city_db,omitempty"`
	ISPDB  *DBStatus `json:"isp_db,omitempty"`
}

// Health reports what the dispatcher places clients by, its databases and its live nodes.
func (d *Dispatcher) Health() Health {
	h := Health{Mode: ModeLoadOnly, Nodes: d.LiveNodes()}
	if d.geo == nil {
		return h
	}
	h.CityDB, h.ISPDB = d.geo.status(kindCity), d.geo.status(kindISP)
	switch {
	case h.CityDB != nil && h.ISPDB != nil:
		h.Mode = ModeRegionISP
	case h.CityDB != nil:
		h.Mode = ModeRegion
	default:
		h.Mode = ModeISP
	}
	return h
}

func (d *Dispatcher) locate(ip netip.Addr) location {
	if d.geo == nil {
		return location{}
	}
	loc := d.geo.state.Load().locate(ip)
	loc.near = d.near.lookup(loc.region)
	return loc
}

// Dispatch ranks the live nodes for a client and returns the best TopK, counting the client
// against the first one until that node's next report. A client of a room goes first to a node
// that holds the room, within the room's limit there (placeInRoom).
func (d *Dispatcher) Dispatch(req Request) (Answer, error) {
	if err := req.check(); err != nil {
		return Answer{}, err
	}
	now := d.now()
	loc := d.locate(req.Client)
	pool := d.pools.Load().forRoom(req.App, req.Room)
	key := loc.bucket()
	key.pool = pool.id()
	var buf [maxCandidates]scored
	var sc []scored
	r, hit := d.cache.get(key, d.gen.Load(), now, d.cacheTTL())
	if r != nil {
		var ok bool
		if sc, ok = d.evaluate(r, now, buf[:0]); !ok {
			r, hit = nil, false
		}
	}
	if r == nil {
		r = d.rank(loc, pool.id(), now)
		if d.cacheTTL() > 0 {
			d.cache.put(key, r)
		}
		sc, _ = d.evaluate(r, now, buf[:0])
	}
	if hit {
		d.m.cacheHit.Inc()
	} else {
		d.m.cacheMiss.Inc()
	}
	if len(sc) == 0 {
		d.m.noNodes.Inc()
		if pool != nil {
			pool.noNodes.Inc()
			return Answer{}, errNoPoolNodes(pool.name)
		}
		return Answer{}, ErrNoNodes
	}
	if pool != nil {
		pool.ok.Inc()
	}
	var first pick
	var k int
	var holder bool
	if req.Room != "" && d.roomAffinity() {
		first, k, holder = d.placeInRoom(roomKey{req.App, req.Room}, loc, pool.id(), r, sc, now)
	} else {
		k = d.choose(sc)
		c := &r.cands[sc[0].i]
		first = pick{n: c.n, level: c.level, sameISP: c.sameISP}
		first.n.assigned.Add(1)
	}
	d.m.decisions.Inc()
	first.n.decisions.Inc()
	d.m.regionMatch[first.level].Inc()
	switch {
	case loc.ispA == 0 && loc.ispB == 0:
		d.m.ispMatch[ispUnknown].Inc()
	case first.sameISP:
		d.m.ispMatch[ispSame].Inc()
	default:
		d.m.ispMatch[ispOther].Inc()
	}
	ans := Answer{TTLMS: d.cfg.TTL.Milliseconds()}
	if !holder {
		ans.Nodes = make([]Endpoint, k)
		for i := range k {
			ans.Nodes[i] = r.cands[sc[i].i].n.snap.Load().endpoint
		}
		return ans, nil
	}
	// The room's node first, then the others best first.
	ans.Nodes = make([]Endpoint, 0, d.cfg.TopK)
	ans.Nodes = append(ans.Nodes, first.n.snap.Load().endpoint)
	for i := 0; i < len(sc) && len(ans.Nodes) < d.cfg.TopK; i++ {
		if n := r.cands[sc[i].i].n; n != first.n {
			ans.Nodes = append(ans.Nodes, n.snap.Load().endpoint)
		}
	}
	return ans, nil
}

// pick is the node a client is counted against, with how near it is for the metrics.
type pick struct {
	n       *node
	level   matchLevel
	sameISP bool
}

// ranking is a bucket's candidates: the best nodes for its clients when it was built, with
// their locality points. Scores are recomputed from live load on every decision; the ranking
// only saves looking at every node.
type ranking struct {
	gen   uint64
	built int64 // unix ns
	cands []candidate
	// cutoff is the best score among the nodes left out, -Inf when none were. Once the best
	// candidate falls below it (by more than the hysteresis) a left-out node may be better,
	// so the ranking is rebuilt.
	cutoff     float64
	rebuilding atomic.Bool
	// live is the set of nodes r was built from and classes their locality classes for the
	// bucket's clients, by index in live (both nil without room affinity or cache): while
	// r.gen is current, a room's holders are classed through their slots (liveSet.index) by
	// one byte each, without reading their labels.
	live    *liveSet
	classes []uint8
}

type candidate struct {
	n        *node
	locality float64
	level    matchLevel
	sameISP  bool
}

// scored is a candidate (its index in ranking.cands) with its live score. It holds no
// pointers, so sorting a decision's candidates on the stack costs no GC write barriers.
type scored struct {
	i     int
	score float64
	used  float64 // predicted connections over capacity: the tie-break of equal-enough nodes
}

// Locality classes: a node's match level with a client and whether it shares the client's
// ISP, class = level*2 + sameISP. Every node of a class has the same locality points.
const numClasses = int(matchLevels) * 2

// classOut is the class of a node that may not take the client: in another pool than the
// client's (Config.Pools). It has no points; rankings and room decisions pass it over.
const classOut = uint8(255)

// rank scores the live nodes of pool (0: the nodes of no reserved pool) for a client at loc
// and keeps the best d.candidates. It visits
// the locality classes best first and stops at the first class whose best possible score
// (its points plus every quality weight) cannot beat the candidates it already has, so a
// located client costs one cheap pass over the nodes plus full scoring of the near ones.
func (d *Dispatcher) rank(loc location, pool uint32, now int64) *ranking {
	r := &ranking{gen: d.gen.Load(), built: now, cutoff: math.Inf(-1), cands: make([]candidate, 0, d.candidates)}
	live := d.liveNodes()
	var classes []uint8
	var scratch *[]uint8
	if d.roomAffinity() && d.cacheTTL() > 0 {
		// Kept with the ranking for placeInRoom; an uncached ranking serves one decision,
		// where classing a room's few holders from their snapshots is cheaper.
		r.live, classes = live, make([]uint8, 0, len(live.labels))
	} else {
		scratch = d.scratch.Get().(*[]uint8)
		classes = (*scratch)[:0]
	}
	var count [numClasses]int
	for i := range live.labels {
		nl := &live.labels[i]
		if nl.pool != pool {
			classes = append(classes, classOut)
			continue
		}
		c := loc.class(nl, nl.snapForMore(live.nodes[i]))
		count[c]++
		classes = append(classes, c)
	}
	stale := false
	scores := make([]float64, 0, d.candidates)
	for _, c := range d.classOrder {
		if count[c] == 0 {
			continue
		}
		points := d.classPoints[c]
		if len(scores) == d.candidates && points+d.maxQuality <= scores[len(scores)-1] {
			r.cutoff = max(r.cutoff, points+d.maxQuality)
			break
		}
		for i, nc := range classes {
			if nc != c {
				continue
			}
			n := live.nodes[i]
			s := n.snap.Load()
			if n.stale(s, now) {
				stale = true
				continue
			}
			score := d.liveScore(s, n.assigned.Load(), now, points)
			if len(scores) == d.candidates {
				last := scores[len(scores)-1]
				if score <= last {
					r.cutoff = max(r.cutoff, score)
					continue
				}
				r.cutoff = max(r.cutoff, last)
				scores, r.cands = scores[:len(scores)-1], r.cands[:len(r.cands)-1]
			}
			j := len(scores)
			for j > 0 && scores[j-1] < score {
				j--
			}
			scores = slices.Insert(scores, j, score)
			r.cands = slices.Insert(r.cands, j, candidate{n: n, locality: points, level: matchLevel(c / 2), sameISP: c%2 == 1})
		}
	}
	if scratch != nil {
		*scratch = classes
		d.scratch.Put(scratch)
	} else {
		r.classes = classes
	}
	if stale {
		d.sweep(now)
	}
	return r
}

// evaluate scores r's candidates on their live load into out, best first. It reports false
// when r should be rebuilt: a candidate missed its reports, every candidate went away, or a
// node left out of r may now score better than all of them.
//
// A candidate whose best possible score (locality plus every quality weight) is below both the
// TopK-th score so far and the near-equal margin of the best cannot be in the answer, and is
// skipped: for a located client that leaves the few nodes of its own region and ISP.
func (d *Dispatcher) evaluate(r *ranking, now int64, out []scored) ([]scored, bool) {
	k, margin := d.cfg.TopK, d.nearEqual()
	for i := range r.cands {
		c := &r.cands[i]
		if len(out) >= k {
			if ub := c.locality + d.maxQuality; ub < out[k-1].score && ub < out[0].score-margin {
				continue
			}
		}
		if c.n.removed.Load() {
			continue
		}
		s := c.n.snap.Load()
		if s.draining {
			continue
		}
		if c.n.stale(s, now) {
			return out, false
		}
		assigned := c.n.assigned.Load()
		v := scored{i: i, score: d.liveScore(s, assigned, now, c.locality), used: (s.conns + float64(assigned)) * s.invCap}
		j := len(out)
		out = append(out, v)
		for j > 0 && out[j-1].score < v.score {
			out[j] = out[j-1]
			j--
		}
		out[j] = v
	}
	if len(out) == 0 {
		return out, len(r.cands) == 0
	}
	return out, out[0].score >= r.cutoff-d.hysteresis
}

// choose puts the answer's nodes first in sc (sorted best first) and returns how many there
// are. Nodes within NearEqual of the best are drawn at random without replacement, weighted
// so that a better score is likelier (the best is up to 11 times likelier than one at the
// edge of the margin), the first place going to the better of two draws; the rest follow in
// score order.
func (d *Dispatcher) choose(sc []scored) int {
	k := min(d.cfg.TopK, len(sc))
	margin := d.nearEqual()
	if margin <= 0 {
		return k
	}
	floor := sc[0].score - margin
	bias := margin / 10
	var weights [maxCandidates]float64
	total := 0.0
	e := 0
	for e < len(sc) && sc[e].score >= floor {
		weights[e] = sc[e].score - floor + bias
		total += weights[e]
		e++
	}
	for i := 0; i < k && i < e-1; i++ {
		x := rand.Float64() * total
		j := i
		for ; j < e-1; j++ {
			if x -= weights[j]; x < 0 {
				break
			}
		}
		total -= weights[j]
		sc[i], sc[j] = sc[j], sc[i]
		weights[i], weights[j] = weights[j], weights[i]
		if i == 0 && e > 1 {
			// The first place goes to the less used of two distinct draws ("power of two
			// choices"): still random, but a node that just took a client loses to an equal one
			// that did not, so even a handful of clients spreads over equal nodes. Within the
			// margin scores are equal enough; the use (predicted connections over capacity) is
			// what must not be swamped by noise such as a CPU reading.
			x, j = rand.Float64()*total, 1
			for ; j < e-1; j++ {
				if x -= weights[j]; x < 0 {
					break
				}
			}
			if sc[j].used < sc[0].used {
				sc[0], sc[j] = sc[j], sc[0]
				weights[0], weights[j] = weights[j], weights[0]
			}
		}
	}
	return k
}

// bucketKey identifies clients that share a ranking: same region, same ISP.
type bucketKey struct {
	continent, country, subdivision, ispA, ispB uint32
	pool                                        uint32 // the client's reserved pool, 0 for none
}

// rankCache holds a ranking per bucket, sharded so that concurrent decisions rarely meet on a
// lock (and a bucketKey never has to become an interface, which would allocate).
type rankCache struct {
	perShard int
	shards   [16]struct {
		mu sync.RWMutex // guards m
		m  map[bucketKey]*ranking
		_  [32]byte // keep shards on separate cache lines
	}
}

func (c *rankCache) init(buckets int) {
	c.perShard = max(buckets/len(c.shards), 1)
	for i := range c.shards {
		c.shards[i].m = make(map[bucketKey]*ranking)
	}
}

func (c *rankCache) shard(k bucketKey) int {
	h := k.continent*0x9e3779b1 ^ k.country*0x85ebca6b ^ k.subdivision*0xc2b2ae35 ^ k.ispA*0x27d4eb2f ^ k.ispB*0x165667b1 ^ k.pool*0x9e3779b9
	return int((h ^ h>>15) % uint32(len(c.shards)))
}

// get returns the bucket's ranking and whether it is fresh. An expired ranking goes to one
// caller as a miss, to rebuild, and to the others as a hit meanwhile.
func (c *rankCache) get(k bucketKey, gen uint64, now, ttl int64) (*ranking, bool) {
	if ttl <= 0 {
		return nil, false
	}
	sh := &c.shards[c.shard(k)]
	sh.mu.RLock()
	r := sh.m[k]
	sh.mu.RUnlock()
	switch {
	case r == nil:
		return nil, false
	case r.gen == gen && now-r.built < ttl:
		return r, true
	case r.rebuilding.CompareAndSwap(false, true):
		return nil, false
	}
	return r, true
}

func (c *rankCache) put(k bucketKey, r *ranking) {
	sh := &c.shards[c.shard(k)]
	sh.mu.Lock()
	if _, ok := sh.m[k]; !ok && len(sh.m) >= c.perShard {
		// Too many buckets: start over rather than track recency on the hot path.
		clear(sh.m)
	}
	sh.m[k] = r
	sh.mu.Unlock()
}

func (c *rankCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}
