// Package applimits keeps each app's limits and address lists (apipb.AppLimits) in the JetStream
// KV bucket rc_app_limits and follows their changes, for the roles that enforce them (the
// ChatLink, the server API). It stores, checks and parses; it must not enforce anything.
package applimits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/clientip"
	"roomcast/internal/ratelimit"
	"roomcast/proto/apipb"
)

// Bucket is the KV bucket of the apps' limits, one key per app.
const Bucket = "rc_app_limits"

// maxListEntries bounds each of an app's address lists.
const maxListEntries = 1000

// Parsed are an app's limits ready to apply. A nil limit means the deployment's default.
type Parsed struct {
	LoginsPerApp, JoinsPerRoom               *ratelimit.Limit
	SendsPerConn, SendsPerUser, SendsPerRoom *ratelimit.Limit
	APICallsPerKey                           *ratelimit.Limit
	Allow, Deny                              clientip.Prefixes
}

// Or returns the app's limit, or def when the app has none of its own.
func Or(own *ratelimit.Limit, def ratelimit.Limit) ratelimit.Limit {
	if own == nil {
		return def
	}
	return *own
}

// Allows says whether the app's lists let a client at a in: not when a is denied, nor, when
// the allow list is not empty, when a is not on it or unknown. A nil Parsed allows everyone.
func (p *Parsed) Allows(a netip.Addr) bool {
	if p == nil {
		return true
	}
	if !a.IsValid() {
		return len(p.Allow) == 0
	}
	return !p.Deny.Contains(a) && (len(p.Allow) == 0 || p.Allow.Contains(a))
}

// Parse checks l and parses it.
func Parse(l *apipb.AppLimits) (*Parsed, error) {
	var p Parsed
	for _, f := range []struct {
		name string
		text string
		dst  **ratelimit.Limit
	}{
		{"logins_per_app", l.LoginsPerApp, &p.LoginsPerApp},
		{"joins_per_room", l.JoinsPerRoom, &p.JoinsPerRoom},
		{"sends_per_conn", l.SendsPerConn, &p.SendsPerConn},
		{"sends_per_user", l.SendsPerUser, &p.SendsPerUser},
		{"sends_per_room", l.SendsPerRoom, &p.SendsPerRoom},
		{"api_calls_per_key", l.ApiCallsPerKey, &p.APICallsPerKey},
	} {
		if f.text == "" {
			continue
		}
		lim, err := ratelimit.Parse(f.text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.dst = &lim
	}
	if len(l.Allow) > maxListEntries || len(l.Deny) > maxListEntries {
		return nil, fmt.Errorf("allow and deny hold at most %d entries each", maxListEntries)
	}
	var err error
	if p.Allow, err = clientip.Parse(l.Allow); err != nil {
		return nil, fmt.Errorf("allow: %w", err)
	}
	if p.Deny, err = clientip.Parse(l.Deny); err != nil {
		return nil, fmt.Errorf("deny: %w", err)
	}
	return &p, nil
}

// Store reads and writes the bucket.
type Store struct{ kv jetstream.KeyValue }

// Open creates or opens the bucket.
func Open(ctx context.Context, js jetstream.JetStream, replicas int) (*Store, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, Replicas: max(1, replicas),
		Description: "Roomcast apps' limits and address lists (SetAppLimits)",
	})
	if err != nil {
		return nil, fmt.Errorf("applimits: KV bucket %s: %w", Bucket, err)
	}
	return &Store{kv: kv}, nil
}

// Get returns app's limits as stored; empty when never set.
func (s *Store) Get(ctx context.Context, app string) (*apipb.AppLimits, error) {
	e, err := s.kv.Get(ctx, app)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &apipb.AppLimits{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("applimits: read %s: %w", app, err)
	}
	var l apipb.AppLimits
	if err := proto.Unmarshal(e.Value(), &l); err != nil {
		return nil, fmt.Errorf("applimits: decode %s: %w", app, err)
	}
	return &l, nil
}

// Put replaces app's limits. The caller has checked them with Parse.
func (s *Store) Put(ctx context.Context, app string, l *apipb.AppLimits) error {
	b, err := proto.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, app, b); err != nil {
		return fmt.Errorf("applimits: write %s: %w", app, err)
	}
	return nil
}

// Watcher follows the bucket: App answers from memory, without a round trip.
type Watcher struct {
	w    jetstream.KeyWatcher
	stop context.CancelFunc // ends the watch's subscription
	log  *slog.Logger
	apps atomic.Pointer[map[string]*Parsed] // replaced whole on each change
}

// Follow reads the bucket's current entries and returns a Watcher; its Run applies later changes.
func (s *Store) Follow(ctx context.Context, log *slog.Logger) (*Watcher, error) {
	// The watch lives until Run ends (its own context: the subscription waits on it).
	wctx, stop := context.WithCancel(context.Background())
	kw, err := s.kv.WatchAll(wctx)
	if err != nil {
		stop()
		return nil, fmt.Errorf("applimits: watch %s: %w", Bucket, err)
	}
	w := &Watcher{w: kw, stop: stop, log: log}
	w.apps.Store(&map[string]*Parsed{})
	for { // the current values, then a nil entry
		select {
		case e := <-kw.Updates():
			if e == nil {
				return w, nil
			}
			w.apply(e)
		case <-ctx.Done():
			_ = kw.Stop()
			stop()
			return nil, fmt.Errorf("applimits: reading %s: %w", Bucket, ctx.Err())
		}
	}
}

// Run applies changes until ctx ends, then stops watching.
func (w *Watcher) Run(ctx context.Context) {
	defer func() { _ = w.w.Stop(); w.stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.w.Updates():
			if !ok {
				return
			}
			if e != nil {
				w.apply(e)
			}
		}
	}
}

func (w *Watcher) apply(e jetstream.KeyValueEntry) {
	old := *w.apps.Load()
	next := make(map[string]*Parsed, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	delete(next, e.Key())
	if e.Operation() == jetstream.KeyValuePut {
		var l apipb.AppLimits
		p, err := (*Parsed)(nil), proto.Unmarshal(e.Value(), &l)
		if err == nil {
			p, err = Parse(&l)
		}
		if err != nil {
			w.log.Warn("app limits not applied", "app", e.Key(), "err", err) // the API checks what it writes
		} else {
			next[e.Key()] = p
		}
	}
	w.apps.Store(&next)
}

// App returns app's limits; nil when it has none.
func (w *Watcher) App(app string) *Parsed {
	if w == nil {
		return nil
	}
	return (*w.apps.Load())[app]
}

// Cache answers an app's limits from a copy at most MaxAge old, read again on demand: for a
// role without a lifetime to run a Watcher in (the server API).
type Cache struct {
	store  *Store
	maxAge time.Duration
	now    func() time.Time

	mu   sync.Mutex // guards apps
	apps map[string]cached
}

type cached struct {
	at time.Time
	p  *Parsed
}

// NewCache returns a cache of s whose entries are read again when older than maxAge.
func NewCache(s *Store, maxAge time.Duration) *Cache {
	return &Cache{store: s, maxAge: maxAge, now: time.Now, apps: make(map[string]cached)}
}

// App returns app's limits; nil when it has none (or c is nil). When the store cannot be read, the last copy
// (or none) stays in force.
func (c *Cache) App(ctx context.Context, app string) *Parsed {
	if c == nil {
		return nil
	}
	now := c.now()
	c.mu.Lock()
	e, ok := c.apps[app]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.maxAge {
		return e.p
	}
	if l, err := c.store.Get(ctx, app); err == nil {
		if p, err := Parse(l); err == nil {
			e.p = p
		}
	}
	e.at = now // a failed read is not retried at every call
	c.mu.Lock()
	c.apps[app] = e
	c.mu.Unlock()
	return e.p
}
