package cdnpusher

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/auth"
	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// validNames reports whether app and room may name a segment: the same rule as every other name
// (auth.ValidName), which keeps keys and URLs free of characters that need escaping.
func validNames(app, room string) bool { return auth.ValidName(app) && auth.ValidName(room) }

// Errors Add and Open return; nothing was taken.
var (
	ErrClosed   = errors.New("cdnpusher: closed")
	ErrTargeted = errors.New("cdnpusher: a message with a tag expression never goes into a public segment")
	ErrInvalid  = errors.New("cdnpusher: invalid message")
	ErrReleased = errors.New("cdnpusher: the message's window was released to another pusher")
)

const (
	// numShards spreads rooms over locks so that callers adding to different rooms rarely meet.
	numShards = 32
	// maxAhead is how many windows past the oldest open one a message may be held in: a message
	// stamped further ahead (a clock far off) goes into the last of them.
	maxAhead = 8
	// noEnd is the end of a room that was not released.
	noEnd = math.MaxInt64
)

// Pusher aggregates rooms' messages into one segment per window and writes the segments to S3.
// Its methods are safe for concurrent use.
type Pusher struct {
	cfg         Config
	windowMs    uint32
	idleWindows int64
	seed        maphash.Seed
	shards      [numShards]shard
	rooms       atomic.Int64 // rooms across the shards
	queue       *queue
	store       store
	transport   *http.Transport // the store's: Close drops its idle connections
	metrics     *metrics

	sealMu sync.Mutex // serializes seal: the ticker's and Close's

	storageDown atomic.Bool // the last write failed; logs the outage once and the recovery once

	sweeper   *sweeper           // nil when segments never expire
	stopSweep context.CancelFunc // called by Close: the sweeper stops
	sweeps    sync.WaitGroup     // the sweeper goroutine

	stopSealer chan struct{}      // closed by Close: the sealer stops
	abort      context.Context    // ended when Close's context ends: writers give up
	cancel     context.CancelFunc // ends abort
	sealer     sync.WaitGroup     // the sealer goroutine
	writers    sync.WaitGroup     // the writer goroutines
	closeOnce  sync.Once
	closeErr   error
}

// shard holds some of the rooms.
type shard struct {
	mu    sync.Mutex // guards the fields below
	rooms map[roomKey]*room
	// released are the rooms given away (Release) and written out up to their end: the end,
	// kept for Config.Idle so that a straggling message cannot open the room again here.
	released map[roomKey]int64
	rng      *rand.Rand // for sampling
	free     []*window  // windows written out, ready for reuse
	closed   bool       // Close has written the rooms out: Add refuses
}

type roomKey struct{ app, room string }

// room is one room's windows that are not written out yet.
type room struct {
	app, name  string
	open       int64     // the oldest window not yet written out
	lastActive int64     // the newest window that had a message (or in which Open was called)
	end        int64     // Release: windows from here on are another pusher's; noEnd if none
	assigned   bool      // Assign: kept active, quiet or not, until Release
	pending    []*window // pending[i] is window open+i; nil while it has no message
}

// store is where segments go: an S3 bucket in production.
type store interface {
	put(ctx context.Context, key string, body []byte) error
}

// New returns a pusher that writes to the configured bucket. It does not touch storage: a
// pusher starts, and takes messages, while storage is down.
func New(cfg Config) (*Pusher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	transport, err := minio.DefaultTransport(cfg.Secure)
	if err != nil {
		return nil, fmt.Errorf("cdnpusher: %w", err)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    cfg.Secure,
		Region:    cfg.Region,
		Transport: transport,
		// One attempt per call: the pusher retries itself, counting and bounding it.
		MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("cdnpusher: %w", err)
	}
	p := &Pusher{
		cfg:         cfg,
		windowMs:    cfg.windowMs(),
		idleWindows: max(1, int64(cfg.Idle/cfg.Window)),
		seed:        maphash.MakeSeed(),
		queue:       newQueue(cfg.Queue),
		store:       &s3Store{client: client, bucket: cfg.Bucket},
		transport:   transport,
		stopSealer:  make(chan struct{}),
	}
	for i := range p.shards {
		p.shards[i].rooms = map[roomKey]*room{}
		p.shards[i].released = map[roomKey]int64{}
		p.shards[i].rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	p.metrics = newMetrics(cfg.Registerer,
		func() float64 { return float64(p.queue.len()) },
		func() float64 { return float64(p.rooms.Load()) })
	p.abort, p.cancel = context.WithCancel(context.Background())
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	p.stopSweep = stopSweep
	if cfg.SegmentTTL > 0 {
		p.sweeper = &sweeper{
			client: client, bucket: cfg.Bucket, prefix: cfg.Prefix, ttl: cfg.SegmentTTL,
			interval: cfg.SweepInterval, now: cfg.Now, metrics: p.metrics, log: cfg.Logger,
		}
		p.sweeps.Add(1)
		go func() {
			defer p.sweeps.Done()
			p.sweeper.run(sweepCtx)
		}()
	}
	p.sealer.Add(1)
	go p.runSealer()
	p.writers.Add(cfg.Writers)
	for range cfg.Writers {
		go p.runWriter()
	}
	return p, nil
}

// Add hands m, a message of room m.Room of app, to the window of its server time (or, if that
// window was already written out, to the oldest one still open). It never waits on storage.
// The pusher keeps m: the caller must not change it afterwards. A message refused is counted
// by its reason (roomcast_cdnpusher_refused_messages_total).
func (p *Pusher) Add(app string, m *clientpb.Message) error {
	return p.addFrom(app, m, trace.SpanContext{})
}

// addFrom is Add for a message that came in the traced batch from (a zero SpanContext: not
// traced): the write of its segment is traced under from.
func (p *Pusher) addFrom(app string, m *clientpb.Message, from trace.SpanContext) error {
	err := p.add(app, m, from)
	if err != nil {
		p.metrics.refused[refusalOf(err)].Inc()
	}
	return err
}

func (p *Pusher) add(app string, m *clientpb.Message, from trace.SpanContext) error {
	switch {
	case m == nil:
		return fmt.Errorf("%w: nil", ErrInvalid)
	case m.TagExpr != "":
		return ErrTargeted
	case !validNames(app, m.Room):
		return fmt.Errorf("%w: app %q, room %q", ErrInvalid, app, m.Room)
	case m.Id == "" || !utf8.ValidString(m.Id) || !utf8.ValidString(m.Sender) || !utf8.ValidString(m.Type):
		// A string that is not UTF-8 would make the whole segment fail to encode.
		return fmt.Errorf("%w: id, sender or type", ErrInvalid)
	}
	index := segment.Index(m.ServerTimeMs, p.windowMs)
	sh := p.shard(m.Room)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return ErrClosed
	}
	if end, ok := sh.released[roomKey{app, m.Room}]; ok && index >= end {
		sh.mu.Unlock()
		return ErrReleased
	}
	// A room's first message opens it at its own window, not before: after a handoff
	// (Assign's from) the windows before it are another pusher's.
	r := p.roomOf(sh, app, m.Room, index)
	switch {
	case index < r.open:
		index = r.open
		p.metrics.late.Inc()
	case index > r.open+maxAhead:
		index = r.open + maxAhead
	}
	if index >= r.end {
		sh.mu.Unlock()
		return ErrReleased
	}
	for int64(len(r.pending)) <= index-r.open {
		r.pending = append(r.pending, nil)
	}
	w := r.pending[index-r.open]
	if w == nil {
		w = sh.newWindow()
		r.pending[index-r.open] = w
	}
	w.add(m, p.cfg.MaxMessages, sh.rng, from)
	r.lastActive = max(r.lastActive, index)
	sh.mu.Unlock()
	p.metrics.messages.Inc()
	return nil
}

// Open makes a room active without a message: from now on each of its windows gets a segment,
// empty while quiet, until it has had no message for Config.Idle (unless Assign keeps it).
func (p *Pusher) Open(app, name string) error {
	return p.assign(app, name, math.MinInt64, noEnd, false)
}

// Assign makes the room this pusher's from window from on (or from the current window, if that
// is later): the windows before from are left to the pusher that had the room, and a Release
// of the room is undone. Unlike Open, it keeps the room active however long it stays quiet,
// every window getting a segment (empty if quiet), until Release: a pusher that a room's route
// names writes all its windows, as clients expect.
func (p *Pusher) Assign(app, name string, from int64) error {
	return p.assign(app, name, from, noEnd, true)
}

// assign makes the room this pusher's from window from (see Assign) up to until (noEnd: no
// end), in one step: a route that names this pusher while the room leaves CDN mode gives both.
// keep keeps the room active while quiet (Assign); without it the room idles out (Open).
func (p *Pusher) assign(app, name string, from, until int64, keep bool) error {
	if !validNames(app, name) {
		return fmt.Errorf("%w: app %q, room %q", ErrInvalid, app, name)
	}
	sh := p.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return ErrClosed
	}
	delete(sh.released, roomKey{app, name})
	r := p.roomOf(sh, app, name, from)
	switch {
	case until != noEnd:
		r.assigned = false // it ends: written up to until, then forgotten
	case keep:
		r.assigned = true
	}
	r.end = until
	r.lastActive = max(r.lastActive, r.open)
	if until != noEnd {
		r.lastActive = max(r.lastActive, until-1) // written up to its end, not idled out
	}
	return nil
}

// Release gives the room's windows from until on to another pusher (or back to the long
// connections): this one writes the windows before until (a window holding no message, empty),
// then forgets the room; messages stamped from until on are refused with ErrReleased. A room
// the pusher does not have is left alone, and so is a release at a later window than one
// already made: windows given away stay given away (only Assign takes them back).
func (p *Pusher) Release(app, name string, until int64) {
	sh := p.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r := sh.rooms[roomKey{app, name}]; r != nil && until < r.end {
		r.end, r.assigned = until, false
		r.lastActive = max(r.lastActive, until-1) // written up to the handoff, not idled out
	}
}

// Rooms returns how many rooms the pusher writes segments for.
func (p *Pusher) Rooms() int { return int(p.rooms.Load()) }

// Close writes out every window holding messages (the current ones too), waits until storage
// has taken the queued segments or ctx ends (what is left is counted as gaps and ctx's error
// returned), and stops the pusher's goroutines. Add and Open fail afterwards. Close may be
// called more than once; later calls return the first one's result.
func (p *Pusher) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		// Deleting expired segments is never urgent: what this sweep leaves, the next run's takes.
		p.stopSweep()
		p.sweeps.Wait()
		close(p.stopSealer)
		p.sealer.Wait()
		p.seal(true)
		p.queue.close()
		done := make(chan struct{})
		go func() {
			p.writers.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			p.closeErr = fmt.Errorf("cdnpusher: close: %w", ctx.Err())
			p.cancel()
			<-done
		}
		p.cancel()
		p.transport.CloseIdleConnections()
	})
	return p.closeErr
}

func (p *Pusher) shard(name string) *shard {
	return &p.shards[maphash.String(p.seed, name)%numShards]
}

// roomOf returns the room, creating it with the current window or from, whichever is later, as
// its oldest open one (from more than maxAhead windows ahead, a clock far off, is not believed).
// Caller holds sh.mu.
func (p *Pusher) roomOf(sh *shard, app, name string, from int64) *room {
	k := roomKey{app, name}
	r := sh.rooms[k]
	if r == nil {
		open := p.currentIndex(p.cfg.Now())
		if from > open && from <= open+maxAhead {
			open = from
		}
		r = &room{app: app, name: name, open: open, lastActive: open, end: noEnd}
		sh.rooms[k] = r
		p.rooms.Add(1)
	}
	return r
}

// newWindow returns an empty window, reusing one written out before. Caller holds sh.mu.
func (sh *shard) newWindow() *window {
	if n := len(sh.free); n > 0 {
		w := sh.free[n-1]
		sh.free = sh.free[:n-1]
		return w
	}
	return &window{}
}

// currentIndex is the oldest window still taking messages at now: the one that was current
// Grace ago.
func (p *Pusher) currentIndex(now time.Time) int64 {
	return segment.Index(now.UnixMilli()-p.cfg.Grace.Milliseconds(), p.windowMs)
}

// runSealer writes out windows as they close, checking the clock twenty times a window.
func (p *Pusher) runSealer() {
	defer p.sealer.Done()
	t := time.NewTicker(max(p.cfg.Window/20, 5*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-p.stopSealer:
			return
		case <-t.C:
			p.seal(false)
		}
	}
}

// closedWindow is a window taken out of its room, to be made into a segment outside the lock.
type closedWindow struct {
	app, room string
	index     int64
	msgs      []*clientpb.Message
	sampled   int
	traced    []trace.SpanContext // window.traced
}

// seal writes out every window that has closed by the clock (an empty segment for a window
// without messages) and forgets rooms idle for Config.Idle (never an assigned one). With final (at Close) it also
// writes out the open windows that hold messages, and the shards refuse Add from then on.
func (p *Pusher) seal(final bool) {
	p.sealMu.Lock()
	defer p.sealMu.Unlock()
	cur := p.currentIndex(p.cfg.Now())
	var out []closedWindow
	for i := range p.shards {
		sh := &p.shards[i]
		out = out[:0]
		sh.mu.Lock()
		for k, r := range sh.rooms {
			for r.open < cur && r.open < r.end {
				out = append(out, p.closeOldest(sh, r))
			}
			if final {
				for len(r.pending) > 0 && r.open < r.end {
					if r.pending[0] != nil {
						out = append(out, p.closeOldest(sh, r))
					} else {
						r.pending = r.pending[1:]
						r.open++
					}
				}
			}
			if final || r.open >= r.end || (!r.assigned && r.open > r.lastActive+p.idleWindows) {
				if r.end != noEnd {
					sh.released[k] = r.end
				}
				delete(sh.rooms, k)
				p.rooms.Add(-1)
			}
		}
		for k, end := range sh.released {
			if cur > end+p.idleWindows {
				delete(sh.released, k)
			}
		}
		sh.closed = final
		sh.mu.Unlock()
		for _, w := range out {
			p.enqueue(w)
		}
	}
}

// closeOldest takes the room's oldest open window out of it. Caller holds sh.mu.
func (p *Pusher) closeOldest(sh *shard, r *room) closedWindow {
	cw := closedWindow{app: r.app, room: r.name, index: r.open}
	if len(r.pending) > 0 {
		if w := r.pending[0]; w != nil {
			cw.msgs, cw.sampled = w.take(p.cfg.MaxMessages, sh.rng)
			cw.traced, w.traced = w.traced, nil
			sh.free = append(sh.free, w)
		}
		copy(r.pending, r.pending[1:])
		r.pending[len(r.pending)-1] = nil
		r.pending = r.pending[:len(r.pending)-1]
	}
	r.open++
	return cw
}

// enqueue encodes a closed window as a segment and queues it for storage, dropping the oldest
// queued segment if the queue is full.
func (p *Pusher) enqueue(w closedWindow) {
	order(w.msgs)
	s := &clientpb.Segment{
		App: w.app, Room: w.room, WindowMs: p.windowMs, Index: w.index,
		Messages: w.msgs,
		Sampled:  uint32(w.sampled),
		NextAtMs: (w.index+2)*int64(p.windowMs) + p.cfg.Grace.Milliseconds(),
	}
	body, err := segment.Encode(s)
	if err != nil {
		// Add refuses what cannot be encoded, so this is a bug; the window is a gap.
		p.cfg.Logger.Error("cdnpusher: encode segment", "app", w.app, "room", w.room, "index", w.index, "err", err)
		return
	}
	p.metrics.sampled.Add(float64(w.sampled))
	dropped, full := p.queue.push(pending{
		key:    p.cfg.Prefix + segment.Key(w.app, w.room, p.windowMs, w.index),
		body:   body,
		empty:  len(w.msgs) == 0,
		closed: time.Now(),
		traced: w.traced,
	})
	if full {
		p.gap(dropped, gapQueueFull)
	}
}

// gap counts a segment that will never be written.
func (p *Pusher) gap(s pending, reason string) {
	p.metrics.gaps[reason].Inc()
	p.cfg.Logger.Debug("cdnpusher: segment dropped", "key", s.key, "reason", reason)
}
