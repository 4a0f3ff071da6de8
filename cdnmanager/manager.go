package cdnmanager

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
	"roomcast/store/cdnstore"
)

const (
	// bucketLeader holds the leader's lease: one key, renewed by the leader, gone LeaderTTL
	// after its last renewal.
	bucketLeader = "rc_cdn_leader"
	leaderKey    = "leader"
	// handoffWindows is how many windows ahead a planned handoff (a rebalance, a pusher
	// leaving) takes effect: time for the room service and both pushers to read the route
	// before the first window the new pusher writes.
	handoffWindows = 2
	// maxMovesPerTick bounds the rooms one rebalance moves.
	maxMovesPerTick = 16
)

// Reasons a room's pusher changed (the assignment changes metric's label).
const (
	reasonNew       = "new"       // the room entered CDN mode
	reasonLost      = "lost"      // its pusher's lease ended
	reasonHandoff   = "handoff"   // its pusher is leaving
	reasonRebalance = "rebalance" // pushers came: rooms spread again
	reasonOff       = "off"       // the room left CDN mode
)

// Manager is one manager instance.
type Manager struct {
	cfg      Config
	log      *slog.Logger
	windowMs uint32
	vendors  []*clientpb.CdnVendor // from cfg.BaseURLs
	store    *cdnstore.Store
	leaderKV jetstream.KeyValue
	subs     []*nats.Subscription
	unwatch  []func()
	metrics  *metrics
	kick     chan struct{} // a change to act on before the next tick

	mu       sync.Mutex // guards the fields below
	pushers  map[string]pusherState
	nodes    map[string]*nodeState
	policies map[string]*apipb.CdnPolicy
	pins     map[roomKey]*apipb.RoomCdn
	routes   map[roomKey]*buspb.CdnRoute
	ruleHeld map[roomKey]time.Time // rooms the rules hold in CDN mode: when they last held
	started  time.Time

	// Touched only by the loop goroutine.
	leaderRev uint64 // of the lease this instance holds; 0 when it does not lead
	renewed   time.Time

	stop      chan struct{}
	loop      sync.WaitGroup
	closeOnce sync.Once
}

// Start starts a manager instance: it opens the KV buckets, follows the policies and routes and
// the reports, and competes for the lead. On error, whatever had started is stopped.
func Start(cfg Config) (_ *Manager, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, log: cfg.Log.With("svc", "cdnmanager"), windowMs: uint32(cfg.Window / time.Millisecond),
		kick:    make(chan struct{}, 1),
		pushers: map[string]pusherState{}, nodes: map[string]*nodeState{},
		policies: map[string]*apipb.CdnPolicy{}, pins: map[roomKey]*apipb.RoomCdn{},
		routes: map[roomKey]*buspb.CdnRoute{}, ruleHeld: map[roomKey]time.Time{},
		started: cfg.Now(), stop: make(chan struct{}),
	}
	for _, base := range cfg.BaseURLs {
		m.vendors = append(m.vendors, &clientpb.CdnVendor{UrlTemplate: strings.TrimSuffix(base, "/") + "/{app}/{room}/{window_ms}/{index}", Weight: 1})
	}
	m.metrics = newMetrics(cfg.Registerer, m.gauges)
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m.store, err = cdnstore.OpenStore(ctx, cfg.Bus, cfg.KVReplicas); err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Bus)
	if err != nil {
		return nil, fmt.Errorf("cdnmanager: jetstream: %w", err)
	}
	if m.leaderKV, err = bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: bucketLeader, History: 1, TTL: cfg.LeaderTTL, Replicas: cfg.KVReplicas,
		Description: "Roomcast CDN manager's leader lease",
	}); err != nil {
		return nil, fmt.Errorf("cdnmanager: KV bucket %s: %w", bucketLeader, err)
	}
	for subject, h := range map[string]nats.MsgHandler{
		bus.SubjectCdnPushers:     m.onPusherReport,
		bus.SubjectSessionsReport: m.onNodeReport,
		bus.SubjectLoad:           m.onLoadReport,
	} {
		sub, err := cfg.Bus.Subscribe(subject, h)
		if err != nil {
			return nil, fmt.Errorf("cdnmanager: subscribe %s: %w", subject, err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		m.subs = append(m.subs, sub)
	}
	for kv, apply := range map[jetstream.KeyValue]func(string, []byte){m.store.Policies(): m.applyPolicy, m.store.Routes(): m.applyRoute} {
		stop, err := bus.FollowKV(ctx, kv, apply)
		if err != nil {
			return nil, err
		}
		m.unwatch = append(m.unwatch, stop)
	}
	m.loop.Add(1)
	go m.run()
	return m, nil
}

// Close stops the instance; a leader gives up its lease, so another instance leads at once. It
// may be called more than once.
func (m *Manager) Close() {
	m.closeOnce.Do(func() {
		close(m.stop)
		m.loop.Wait()
		if m.leaderRev != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = m.leaderKV.Delete(ctx, leaderKey, jetstream.LastRevision(m.leaderRev))
			cancel()
			m.leaderRev = 0
		}
		for _, sub := range m.subs {
			_ = sub.Unsubscribe()
		}
		for _, stop := range m.unwatch {
			stop()
		}
	})
}

// Leader reports whether this instance leads.
func (m *Manager) Leader() bool { return m.metrics.isLeader() }

// kickLocked asks the loop to look at the rooms now. Caller holds mu (or not: it never waits).
func (m *Manager) kickLocked() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// applyPolicy follows cdnstore.BucketPolicy: "<app>" keys are policies, "<app>.<room>" keys pins.
func (m *Manager) applyPolicy(key string, value []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.kickLocked()
	app, room, isRoom := strings.Cut(key, ".")
	if !isRoom {
		p := &apipb.CdnPolicy{}
		if value == nil || proto.Unmarshal(value, p) != nil {
			delete(m.policies, app)
			return
		}
		m.policies[app] = p
		return
	}
	k := roomKey{app, room}
	rc := &apipb.RoomCdn{}
	if value == nil || proto.Unmarshal(value, rc) != nil {
		delete(m.pins, k)
		return
	}
	m.pins[k] = rc
}

// applyRoute follows cdnstore.BucketRoutes, which the leader writes: every instance knows the
// routes when it comes to lead.
func (m *Manager) applyRoute(key string, value []byte) {
	app, room, _ := strings.Cut(key, ".")
	k := roomKey{app, room}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := &buspb.CdnRoute{}
	if value == nil || proto.Unmarshal(value, r) != nil {
		delete(m.routes, k)
		return
	}
	m.routes[k] = r
}

// run leads (or waits to) and looks at the rooms every Tick, and at once after a change.
func (m *Manager) run() {
	defer m.loop.Done()
	t := time.NewTicker(m.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-m.kick:
		}
		m.tick()
	}
}

func (m *Manager) tick() {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Tick*4)
	defer cancel()
	now := m.cfg.Now()
	m.mu.Lock()
	m.watchRulesLocked(now)
	m.mu.Unlock()
	if !m.lead(ctx) {
		return
	}
	m.mu.Lock()
	plan := m.planLocked(now, segment.Index(now.UnixMilli(), m.windowMs))
	m.mu.Unlock()
	for _, c := range plan {
		m.apply(ctx, c)
	}
}

// lead takes or renews the leader's lease and reports whether this instance leads.
func (m *Manager) lead(ctx context.Context) bool {
	now := time.Now()
	if m.leaderRev != 0 {
		if now.Sub(m.renewed) < m.cfg.LeaderTTL/3 {
			return true
		}
		rev, err := m.leaderKV.Update(ctx, leaderKey, []byte(m.cfg.ID), m.leaderRev)
		if err == nil {
			m.leaderRev, m.renewed = rev, now
			return true
		}
		m.log.Warn("lost the lead", "err", err)
		m.leaderRev = 0
		m.metrics.setLeader(false)
		return false
	}
	rev, err := m.leaderKV.Create(ctx, leaderKey, []byte(m.cfg.ID))
	if err != nil {
		return false
	}
	m.leaderRev, m.renewed = rev, now
	m.metrics.setLeader(true)
	m.log.Info("leading")
	return true
}

// watchRulesLocked notes the rooms the rules hold now, on every instance, so a new leader
// keeps their hold. Caller holds mu.
func (m *Manager) watchRulesLocked(now time.Time) {
	for k, l := range m.loadsLocked(now) {
		if m.ruleFiresLocked(k.app, l) {
			m.ruleHeld[k] = now
		}
	}
	for k, held := range m.ruleHeld {
		if now.Sub(held) >= m.cfg.RuleHold {
			delete(m.ruleHeld, k)
		}
	}
	for id, st := range m.pushers {
		if now.Sub(st.seen) > 10*m.cfg.PusherLease {
			delete(m.pushers, id)
		}
	}
}

func (m *Manager) policyLocked(app string) *apipb.CdnPolicy {
	if p := m.policies[app]; p != nil {
		return p
	}
	return &apipb.CdnPolicy{}
}

// ruleFiresLocked reports whether an app's rules put a room with load l in CDN mode. Caller
// holds mu.
func (m *Manager) ruleFiresLocked(app string, l roomLoad) bool {
	p := m.policyLocked(app)
	threshold, level := m.cfg.OnlineThreshold, m.cfg.FlowControlLevel
	if p.OnlineThreshold != 0 {
		threshold = p.OnlineThreshold
	}
	if p.FlowControlLevel != 0 {
		level = p.FlowControlLevel
	}
	return (threshold > 0 && l.online >= threshold) || (level > 0 && l.online > 0 && l.strength >= level)
}

// desiredLocked returns the mode a room should be in, and whether the rules (not a pin) say so.
// Caller holds mu.
func (m *Manager) desiredLocked(k roomKey) (clientpb.CdnMode, bool) {
	if pin := m.pins[k]; pin != nil && !pin.Automatic {
		return pin.PinnedMode, false
	}
	if _, held := m.ruleHeld[k]; held {
		if mode := m.policyLocked(k.app).RuleMode; mode != clientpb.CdnMode_CDN_MODE_OFF {
			return mode, true
		}
		return clientpb.CdnMode_CDN_MODE_BULK, true
	}
	return clientpb.CdnMode_CDN_MODE_OFF, true
}

// memberConfigLocked returns what members of an app's room in mode are told, or nil when the
// room cannot be in that mode: mode off, or no vendor to poll. Caller holds mu.
func (m *Manager) memberConfigLocked(app string, mode clientpb.CdnMode) *clientpb.CdnConfig {
	if mode == clientpb.CdnMode_CDN_MODE_OFF {
		return nil
	}
	p := m.policyLocked(app)
	c := &clientpb.CdnConfig{
		Mode: mode, WindowMs: m.windowMs, Vendors: p.Vendors,
		PollIntervalMs: p.PollIntervalMs, PollJitterMs: p.PollJitterMs,
	}
	if len(c.Vendors) == 0 {
		c.Vendors = m.vendors
	}
	if c.PollIntervalMs == 0 {
		c.PollIntervalMs = uint32(m.cfg.PollInterval.Milliseconds())
	}
	if c.PollJitterMs == 0 {
		c.PollJitterMs = uint32(m.cfg.PollJitter.Milliseconds())
	}
	if len(c.Vendors) == 0 {
		return nil
	}
	return c
}

// liveLocked reports whether a pusher may keep or get rooms: it reported within the lease, is
// not leaving and has the manager's window. A pusher not heard of yet is given the benefit of
// the doubt for a lease after the instance started (it may have reported before). Caller holds
// mu.
func (m *Manager) liveLocked(id string, now time.Time) bool {
	st, ok := m.pushers[id]
	if !ok {
		return now.Sub(m.started) < m.cfg.PusherLease
	}
	return !st.leaving && now.Sub(st.seen) <= m.cfg.PusherLease && st.windowMs == m.windowMs
}

// change is one write the leader makes to a route, and what members are told of it.
type change struct {
	key      roomKey
	route    *buspb.CdnRoute // nil: the room leaves CDN mode
	announce *clientpb.CdnConfig
	reason   string // an assignment change's reason, or "" for none
}

// planLocked decides every room's mode and pusher at now (window cur): rooms in or out of CDN
// mode, rooms whose pusher left or was lost, config changes, and a rebalance over the live
// pushers. Caller holds mu.
func (m *Manager) planLocked(now time.Time, cur int64) []change {
	counts := map[string]int{}
	for id := range m.pushers {
		if m.liveLocked(id, now) {
			counts[id] = 0
		}
	}
	for _, r := range m.routes {
		if _, ok := counts[r.Pusher]; ok {
			counts[r.Pusher]++
		}
	}
	keys := map[roomKey]bool{}
	for k := range m.pins {
		keys[k] = true
	}
	for k := range m.routes {
		keys[k] = true
	}
	for k := range m.ruleHeld {
		keys[k] = true
	}
	var plan []change
	planned := map[roomKey]bool{}
	for _, k := range slices.SortedFunc(maps.Keys(keys), func(a, b roomKey) int { return cmp.Compare(a.String(), b.String()) }) {
		mode, automatic := m.desiredLocked(k)
		cfg := m.memberConfigLocked(k.app, mode)
		r := m.routes[k]
		if r != nil && r.UntilIndex != 0 {
			if c, ok := m.endingLocked(k, r, cfg, automatic, cur, now, len(counts) > 0); ok {
				plan = append(plan, c)
			}
			planned[k] = true
			continue
		}
		if cfg == nil || len(counts) == 0 {
			switch {
			case r == nil:
			case len(counts) == 0 || m.lostLocked(r.Pusher, now):
				// Nobody writes the room's windows from now on: its members stop polling at once.
				plan = append(plan, change{key: k, announce: &clientpb.CdnConfig{Mode: clientpb.CdnMode_CDN_MODE_OFF}, reason: reasonOff})
				planned[k] = true
			default:
				plan = append(plan, m.endLocked(k, r, cur, now))
				planned[k] = true
			}
			continue
		}
		next := &buspb.CdnRoute{App: k.app, Room: k.room, Mode: mode, Config: cfg, Automatic: automatic, UpdatedMs: now.UnixMilli()}
		c := change{key: k, route: next}
		switch {
		case r == nil:
			next.Pusher, next.FromIndex = leastLoaded(counts), cur
			counts[next.Pusher]++
			c.announce, c.reason = cfg, reasonNew
		case !m.liveLocked(r.Pusher, now):
			// A lost pusher took the current window's messages so far with it: the new one
			// starts at the next window, so the lost windows are missing indexes, not
			// segments that look whole and are not.
			next.Pusher, next.PrevPusher, next.FromIndex = leastLoaded(counts), r.Pusher, cur+1
			counts[next.Pusher]++
			c.reason = reasonLost
			if st, ok := m.pushers[r.Pusher]; ok && st.leaving && now.Sub(st.seen) <= m.cfg.PusherLease {
				next.FromIndex, c.reason = cur+handoffWindows, reasonHandoff
			}
		case r.Mode != mode || r.Automatic != automatic || !proto.Equal(r.Config, cfg):
			next.Pusher, next.PrevPusher, next.FromIndex = r.Pusher, r.PrevPusher, r.FromIndex
		default:
			continue
		}
		if r != nil && !proto.Equal(r.Config, cfg) {
			c.announce = cfg
		}
		plan = append(plan, c)
		planned[k] = true
	}
	return append(plan, m.rebalanceLocked(counts, planned, cur, now)...)
}

// endLocked plans a room's leaving CDN mode, handoffWindows ahead as a handoff is: its route
// keeps its pusher up to until_index (the room service, its pusher and its members' ChatLinks
// read that first), after which its CDN lanes go over the long connections again; its members
// are told at once, in an off config whose last_index is the last window the pusher writes, so
// that they poll up to it and lose none of the messages sent before the switch. Caller holds
// mu.
func (m *Manager) endLocked(k roomKey, r *buspb.CdnRoute, cur int64, now time.Time) change {
	until := cur + handoffWindows
	off := &clientpb.CdnConfig{
		Mode: clientpb.CdnMode_CDN_MODE_OFF, WindowMs: r.Config.GetWindowMs(), Vendors: r.Config.GetVendors(),
		PollIntervalMs: r.Config.GetPollIntervalMs(), PollJitterMs: r.Config.GetPollJitterMs(),
		LastIndex: until - 1,
	}
	next := proto.Clone(r).(*buspb.CdnRoute)
	next.UntilIndex, next.Config, next.UpdatedMs = until, off, now.UnixMilli()
	return change{key: k, route: next, announce: off, reason: reasonOff}
}

// endingLocked decides about a room leaving CDN mode (route r, until_index set): its route goes
// once its last window has passed, or at once if its pusher was lost (what that one did not
// write is a gap, as for any lost pusher); a room whose mode is asked for again early enough
// for everyone to read it before until_index stays in CDN mode with its pusher. ok is false
// when nothing changes. Caller holds mu.
func (m *Manager) endingLocked(k roomKey, r *buspb.CdnRoute, cfg *clientpb.CdnConfig, automatic bool, cur int64, now time.Time, pushers bool) (c change, ok bool) {
	switch {
	case cur > r.UntilIndex || m.lostLocked(r.Pusher, now):
		return change{key: k}, true
	case cfg != nil && pushers && m.liveLocked(r.Pusher, now) && r.UntilIndex-cur >= handoffWindows:
		next := proto.Clone(r).(*buspb.CdnRoute)
		next.UntilIndex, next.Mode, next.Config, next.Automatic, next.UpdatedMs = 0, cfg.Mode, cfg, automatic, now.UnixMilli()
		return change{key: k, route: next, announce: cfg}, true
	}
	return change{}, false
}

// lostLocked reports whether a pusher's lease has ended: unlike a pusher that is leaving, it
// writes nothing more. Caller holds mu.
func (m *Manager) lostLocked(id string, now time.Time) bool {
	st, ok := m.pushers[id]
	if !ok {
		return now.Sub(m.started) >= m.cfg.PusherLease
	}
	return now.Sub(st.seen) > m.cfg.PusherLease
}

// rebalanceLocked moves rooms from the busiest live pusher to the idlest until they differ by
// at most one room, a few rooms a tick, never a room already changing. Caller holds mu.
func (m *Manager) rebalanceLocked(counts map[string]int, planned map[roomKey]bool, cur int64, now time.Time) []change {
	var plan []change
	for range maxMovesPerTick {
		hi, lo := mostLoaded(counts), leastLoaded(counts)
		if hi == "" || counts[hi]-counts[lo] <= 1 {
			break
		}
		var move roomKey
		found := false
		for k, r := range m.routes {
			if r.Pusher == hi && r.FromIndex <= cur && r.UntilIndex == 0 && !planned[k] && (!found || k.String() < move.String()) {
				move, found = k, true
			}
		}
		if !found {
			break
		}
		next := proto.Clone(m.routes[move]).(*buspb.CdnRoute)
		next.PrevPusher, next.Pusher, next.FromIndex, next.UpdatedMs = hi, lo, cur+handoffWindows, now.UnixMilli()
		counts[hi]--
		counts[lo]++
		planned[move] = true
		plan = append(plan, change{key: move, route: next, reason: reasonRebalance})
	}
	return plan
}

// leastLoaded and mostLoaded pick among the pushers by rooms, ties by name.
func leastLoaded(counts map[string]int) string {
	return pick(counts, func(a, b int) bool { return a < b })
}

func mostLoaded(counts map[string]int) string {
	return pick(counts, func(a, b int) bool { return a > b })
}

func pick(counts map[string]int, better func(a, b int) bool) string {
	best := ""
	for id, n := range counts {
		if best == "" || better(n, counts[best]) || (n == counts[best] && id < best) {
			best = id
		}
	}
	return best
}

// apply writes one change: the route, then what the room's members are told.
func (m *Manager) apply(ctx context.Context, c change) {
	if err := m.store.SetRoute(ctx, c.key.app, c.key.room, c.route); err != nil {
		m.log.Warn("route not written", "room", c.key, "err", err)
		return
	}
	m.mu.Lock()
	if c.route == nil {
		delete(m.routes, c.key)
	} else {
		m.routes[c.key] = c.route
	}
	m.mu.Unlock()
	if c.reason != "" {
		m.metrics.changes.WithLabelValues(c.reason).Inc()
		m.log.Info("room assigned", "room", c.key, "pusher", c.route.GetPusher(), "from_index", c.route.GetFromIndex(), "reason", c.reason)
	}
	if c.announce != nil {
		if err := bus.Publish(m.cfg.Bus, bus.RoomSubject(c.key.app, c.key.room), &buspb.RoomBatch{Cdn: c.announce}); err != nil {
			m.log.Warn("CDN config not announced", "room", c.key, "err", err)
		}
	}
}

// gauges counts the rooms per mode and the live pushers, for the metrics.
func (m *Manager) gauges() (byMode map[clientpb.CdnMode]int, pushers int) {
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	byMode = map[clientpb.CdnMode]int{}
	for _, r := range m.routes {
		byMode[r.Mode]++
	}
	for id := range m.pushers {
		if m.liveLocked(id, now) {
			pushers++
		}
	}
	return byMode, pushers
}
