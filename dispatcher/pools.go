package dispatcher

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/auth"
)

// Event pools (docs/dispatch.md): ChatLinks set aside for one app or one room. A node is in a
// pool when its load report carries the pool's label (`roomcast chatlink --pool NAME`); the pool
// is reserved when Config.Pools (or SetPools) names it. The reserved room's clients are ranked
// among the pool's nodes only, and everyone else's among the nodes of no reserved pool, so the
// two never meet. A pool with no node left refuses its clients (errNoPoolNodes) rather than
// spilling them onto the nodes it was reserved to keep them off. A node labelled with a pool no
// reservation names serves everyone, like an unlabelled one.

// PoolReservation reserves the ChatLinks labelled Pool for App's room Room, or for every room
// of App when Room is empty.
type PoolReservation struct {
	Pool string `json:"pool"`
	App  string `json:"app"`
	Room string `json:"room,omitempty"`
}

func (r PoolReservation) String() string {
	if r.Room == "" {
		return r.Pool + "=" + r.App
	}
	return r.Pool + "=" + r.App + "/" + r.Room
}

// poolTable is the reservations in force. Immutable; SetPools replaces it whole.
type poolTable struct {
	list   []PoolReservation
	byRoom map[roomKey]*poolEntry
	byApp  map[string]*poolEntry
	byID   map[uint32]*poolEntry // by the pool label's interned id
}

// poolEntry is one reserved pool with its decision counters, resolved once.
type poolEntry struct {
	name        string
	label       uint32 // interned pool name
	ok, noNodes prometheus.Counter
}

// id is the pool's label id, 0 for a client of no pool (p nil).
func (p *poolEntry) id() uint32 {
	if p == nil {
		return 0
	}
	return p.label
}

// CheckPools checks reservations as SetPools does: valid names, a pool reserved once, an app
// or a room reserved once. A room reserved on its own wins over its app's reservation.
func CheckPools(res []PoolReservation) error {
	pools, targets := map[string]bool{}, map[PoolReservation]bool{}
	for _, r := range res {
		if !auth.ValidName(r.Pool) || !auth.ValidName(r.App) || (r.Room != "" && !auth.ValidName(r.Room)) {
			return fmt.Errorf("pool reservation %q: pool, app and room must be 1 to 128 characters of A-Z a-z 0-9 _ -", r.String())
		}
		if pools[r.Pool] {
			return fmt.Errorf("pool %q is reserved twice: a pool serves one app or one room", r.Pool)
		}
		pools[r.Pool] = true
		target := PoolReservation{App: r.App, Room: r.Room}
		if targets[target] {
			return fmt.Errorf("%s is reserved for two pools", strings.TrimPrefix(target.String(), "="))
		}
		targets[target] = true
	}
	return nil
}

// newPoolTable checks reservations (CheckPools) and indexes them.
func (d *Dispatcher) newPoolTable(res []PoolReservation) (*poolTable, error) {
	if err := CheckPools(res); err != nil {
		return nil, err
	}
	t := &poolTable{
		list:   append([]PoolReservation(nil), res...),
		byRoom: map[roomKey]*poolEntry{}, byApp: map[string]*poolEntry{}, byID: map[uint32]*poolEntry{},
	}
	for _, r := range res {
		id := d.in.id(poolPrefix + r.Pool)
		e := &poolEntry{
			name: r.Pool, label: id,
			ok:      d.m.poolDecisions.WithLabelValues(r.Pool, "ok"),
			noNodes: d.m.poolDecisions.WithLabelValues(r.Pool, "no_nodes"),
		}
		t.byID[id] = e
		if r.Room == "" {
			t.byApp[r.App] = e
		} else {
			t.byRoom[roomKey{r.App, r.Room}] = e
		}
	}
	return t, nil
}

// poolPrefix keeps pool labels apart from the other strings the interner holds.
const poolPrefix = "pool:"

// forRoom returns the pool reserved for a client of app's room, nil for none.
func (t *poolTable) forRoom(app, room string) *poolEntry {
	if app == "" || (len(t.byRoom) == 0 && len(t.byApp) == 0) {
		return nil
	}
	if e := t.byRoom[roomKey{app, room}]; e != nil {
		return e
	}
	return t.byApp[app]
}

// nodePool is the reserved pool a node with pool label id label is in, 0 for none.
func (t *poolTable) nodePool(label uint32) uint32 {
	if _, ok := t.byID[label]; ok {
		return label
	}
	return 0
}

// SetPools replaces the pool reservations (Config.Pools), or changes nothing and says why
// when they do not check. Decisions after it returns follow the new reservations; clients
// already on a node stay there.
func (d *Dispatcher) SetPools(res []PoolReservation) error {
	t, err := d.newPoolTable(res)
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	d.mu.Lock()
	d.pools.Store(t)
	d.publishLive()
	d.mu.Unlock()
	d.cache.clear()
	d.log.Info("pool reservations set", "pools", len(res))
	return nil
}

// Pools returns the pool reservations in force.
func (d *Dispatcher) Pools() []PoolReservation {
	return append([]PoolReservation(nil), d.pools.Load().list...)
}

// ParsePoolReservation reads POOL=APP or POOL=APP/ROOM (`roomcast services --reserve-pool`).
func ParsePoolReservation(s string) (PoolReservation, error) {
	var r PoolReservation
	pool, target, ok := strings.Cut(s, "=")
	if !ok {
		return r, errors.New("want POOL=APP or POOL=APP/ROOM")
	}
	app, room, hasRoom := strings.Cut(target, "/")
	r = PoolReservation{Pool: pool, App: app, Room: room}
	if !auth.ValidName(pool) || !auth.ValidName(app) || (hasRoom && !auth.ValidName(room)) {
		return r, fmt.Errorf("%q: want POOL=APP or POOL=APP/ROOM, each 1 to 128 characters of A-Z a-z 0-9 _ -", s)
	}
	return r, nil
}
