package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"roomcast/internal/auth"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// spec is one worker's share of a run: the clients First..First+Count-1 of the run. A worker
// process reads it as JSON from the first line of its standard input.
type spec struct {
	Dispatcher string `json:"dispatcher"`
	App        string `json:"app"`
	Secret     []byte `json:"secret"`
	Transport  string `json:"transport"`
	Room       string `json:"room"`
	// Rooms spreads the clients over rooms Room-0 .. Room-(Rooms-1) when above 1.
	Rooms int   `json:"rooms"`
	Run   runID `json:"run"`
	First int   `json:"first"`
	Count int   `json:"count"`
	// LoginRate paces this worker's logins (login scenario); 0 means as fast as Concurrency
	// allows.
	LoginRate float64 `json:"login_rate"`
	// Concurrency bounds the dials in flight when LoginRate is 0.
	Concurrency int `json:"concurrency"`
	// MessageBuffer is each client's sdk.Config.MessageBuffer.
	MessageBuffer int `json:"message_buffer"`
	// Tags is the number of distinct tag sets of a targeted fanout (see tagging); 0: none.
	Tags int `json:"tags"`
	// Client is ClientSDK or ClientRaw (fanout).
	Client string `json:"client"`
	// CAPEM holds the CA certificates the clients trust (Config.TLSCA); empty: the system's.
	CAPEM []byte `json:"ca_pem,omitempty"`
	// TLSNoResume makes every TLS connection a full handshake (Config.TLSNoResume).
	TLSNoResume bool `json:"tls_no_resume,omitempty"`
	// LiveState has raw members ask for the room's live state (Config.LiveState).
	LiveState bool `json:"live_state,omitempty"`
}

// tlsConfig is the clients' TLS config: trusting CAPEM's certificates, with one session cache
// for all of them unless TLSNoResume, so that a member's handshake resumes a session the
// server gave another.
func (s spec) tlsConfig() *tls.Config {
	cfg := tlsConfig(s.CAPEM)
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if !s.TLSNoResume {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(64)
	}
	return cfg
}

func (s spec) tagging() tagging { return tagging{groups: s.Tags} }

func (s spec) room(i int) string {
	if s.Rooms <= 1 {
		return s.Room
	}
	return fmt.Sprintf("%s-%d", s.Room, i%s.Rooms)
}

// latencyShards spreads the receivers' latency recording over several histograms, so that
// thousands of client goroutines do not queue on one lock.
const latencyShards = 16

// maxErrors bounds the errors a report keeps.
const maxErrors = 5

// newLatencyHistogram records microseconds from 1µs to 10 minutes with 3 significant digits.
func newLatencyHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(10*time.Minute/time.Microsecond), 3)
}

func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	us := min(max(d.Microseconds(), 1), h.HighestTrackableValue())
	_ = h.RecordValue(us)
}

// fleet is the clients of one worker. It owns them: close ends each one.
type fleet struct {
	spec spec
	log  *slog.Logger
	hc   *http.Client
	tls  *tls.Config // the members' (spec.tlsConfig)

	members   []atomic.Pointer[member] // by client index - First; nil for a client that did not log in
	connected atomic.Int64
	failed    atomic.Int64
	limited   atomic.Int64 // logins refused for now (4013, 4015) and tried again after the hint
	tried     atomic.Int64

	shards [latencyShards]struct {
		mu sync.Mutex // guards h
		h  *hdrhistogram.Histogram
	}

	stop    chan struct{} // closed by close: ends the raw members' heartbeats
	pollers *rawPollers   // read the raw members' sockets; nil: a reader goroutine each
	// uploads hears the answers to the members' own sends (bench upload); nil otherwise. Set
	// before connect.
	uploads *uploads
	// likes hears the refusals of the members' likes (bench upload --likes); nil otherwise.
	// Set before the members join.
	likes *likes

	mu         sync.Mutex // guards the fields below
	errors     []string
	loginLat   *hdrhistogram.Histogram
	loginStart time.Time
	loginEnd   time.Time
}

// member is one client and what it received. Its fields other than distinct are written only
// by the client's OnMessage goroutine, and read after the client is closed.
type member struct {
	f        *fleet
	idx      int
	group    int        // its tag group (tagging.group)
	c        memberConn // *sdk.Client or *rawClient
	distinct atomic.Int64
	seen     []uint64 // bitmap of received sequence numbers
	lanes    [4]int64 // distinct deliveries by lane
	dup      int64
	leaked   int64 // receipts of messages whose audience the member is not in
	thinned  int64 // messages its Pushes said were left out of its stream
	first    int64 // first and last receive times, unix nanoseconds
	last     int64
}

func newFleet(sp spec, log *slog.Logger) *fleet {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &fleet{spec: sp, log: log, hc: dispatchClient(sp.First, sp.Count, tlsConfig(sp.CAPEM)), tls: sp.tlsConfig(), members: make([]atomic.Pointer[member], sp.Count), loginLat: newLatencyHistogram(), stop: make(chan struct{})}
	if sp.Client == ClientRaw {
		go f.heartbeats()
		p, err := newRawPollers()
		if err != nil {
			log.Warn("raw members get a reader goroutine each", "err", err)
		}
		f.pollers = p
	}
	for i := range f.shards {
		f.shards[i].h = newLatencyHistogram()
	}
	return f
}

func (f *fleet) addError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errors) < maxErrors {
		f.errors = append(f.errors, err.Error())
	}
}

// connect logs every client of the fleet in: paced at spec.LoginRate when it is set, else with
// at most spec.Concurrency dials in flight. It returns once every client has been tried.
func (f *fleet) connect(ctx context.Context) {
	// The app server mints tokens, not the client: mint them all before the clock starts, so
	// that neither the logins' pace nor their latency carries the signing.
	toks := make([]string, f.spec.Count)
	for j := range toks {
		toks[j] = f.token(j)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(f.spec.Concurrency, 1))
	start := time.Now()
	f.mu.Lock()
	f.loginStart = start
	f.mu.Unlock()
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for j := range f.spec.Count {
		if f.spec.LoginRate > 0 {
			due := start.Add(time.Duration(float64(j) / f.spec.LoginRate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
				case <-timer.C:
				}
			}
		} else {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			f.failed.Add(int64(f.spec.Count - j))
			f.tried.Add(int64(f.spec.Count - j))
			break
		}
		wg.Go(func() {
			if f.spec.LoginRate <= 0 {
				defer func() { <-sem }()
			}
			f.dial(ctx, j, toks[j])
		})
	}
	wg.Wait()
	f.mu.Lock()
	f.loginEnd = time.Now()
	f.mu.Unlock()
}

// token mints the login token of client First+j, or returns "" after recording why it could
// not.
func (f *fleet) token(j int) string {
	i := f.spec.First + j
	uid := fmt.Sprintf("bench-%x-%d", f.spec.Run, i)
	tags := f.spec.tagging()
	tok, err := auth.Mint(f.spec.Secret, f.spec.App, uid, f.spec.room(i), tags.memberTags(i), 12*time.Hour) // well under the ChatLink's 24h maximum token lifetime
	if err != nil {
		f.addError(fmt.Errorf("mint token for %s: %w", uid, err))
		return ""
	}
	return tok
}

// dial logs client First+j in with tok and records how long it took.
func (f *fleet) dial(ctx context.Context, j int, tok string) {
	defer f.tried.Add(1)
	if tok == "" {
		f.failed.Add(1) // token() said why
		return
	}
	i := f.spec.First + j
	m := &member{f: f, idx: i, group: f.spec.tagging().group(i)}
	t0 := time.Now()
	if f.spec.Client == ClientRaw {
		c, err := f.dialRawLimited(ctx, tok, m)
		f.joined(m, c, err, time.Since(t0))
		return
	}
	c, err := sdk.Dial(ctx, sdk.Config{
		Token:          tok,
		Dispatcher:     f.spec.Dispatcher,
		Transport:      f.spec.Transport,
		Device:         "bench",
		HTTPClient:     f.hc,
		Dialer:         DialerFrom(sourceAddr(i)),
		TLS:            f.tls,
		AttemptTimeout: 15 * time.Second,
		MessageBuffer:  f.spec.MessageBuffer,
		NoReconnect:    true, // a member that dropped counts as one
		DedupeWindow:   -1,   // and the server's duplicates are counted
		OnMessage:      m.receive,
		OnEvent: func(e sdk.Event) {
			if _, ok := e.(*sdk.LimitedEvent); ok { // Dial waits it out by itself
				f.limited.Add(1)
			}
		},
		Logger: f.log,
	})
	if err != nil {
		f.joined(m, nil, err, 0)
		return
	}
	f.joined(m, c, nil, time.Since(t0))
}

// joined records the outcome of member m's login, which took took.
func (f *fleet) joined(m *member, c memberConn, err error, took time.Duration) {
	if err != nil {
		f.failed.Add(1)
		f.addError(fmt.Errorf("client %d: %w", m.idx, err))
		return
	}
	m.c = c
	f.members[m.idx-f.spec.First].Store(m)
	f.connected.Add(1)
	f.mu.Lock()
	recordLatency(f.loginLat, took)
	f.mu.Unlock()
}

// receive records one pushed message. It runs on the client's OnMessage goroutine.
func (m *member) receive(msg *clientpb.Message) { m.receiveBody(int32(msg.GetLane()), msg.GetBody()) }

// receiveBody records one pushed message by its lane and body; body is not kept.
func (m *member) receiveBody(lane int32, body []byte) {
	now := time.Now().UnixNano()
	seq, sent, ok := parseBody(body, m.f.spec.Run)
	if !ok {
		return // other traffic in the room
	}
	if !m.f.spec.tagging().target(seq).selects(m.group) {
		m.leaked++ // counted, never as a delivery
		return
	}
	w, bit := seq/64, uint64(1)<<(seq%64)
	if w >= uint64(len(m.seen)) {
		if w > 1<<24 {
			return // not a sequence number this bench sent
		}
		m.seen = append(m.seen, make([]uint64, int(w)+1-len(m.seen)+len(m.seen)/2)...)
	}
	if m.seen[w]&bit != 0 {
		m.dup++
		return
	}
	m.seen[w] |= bit
	if m.first == 0 {
		m.first = now
	}
	m.last = now
	m.lanes[int(lane)&3]++
	m.distinct.Add(1)
	sh := &m.f.shards[m.idx%latencyShards]
	sh.mu.Lock()
	recordLatency(sh.h, time.Duration(now-sent))
	sh.mu.Unlock()
}

// status is a worker's progress, for the progress line.
type status struct {
	Tried     int64 `json:"tried"`
	Connected int64 `json:"connected"`
	Failed    int64 `json:"failed"`
	Delivered int64 `json:"delivered"`
}

func (f *fleet) status() status {
	st := status{Tried: f.tried.Load(), Connected: f.connected.Load(), Failed: f.failed.Load()}
	for i := range f.members {
		if m := f.members[i].Load(); m != nil {
			st.Delivered += m.distinct.Load()
		}
	}
	return st
}

// waitFor returns when every logged-in member has received the distinct messages it should
// (expect[its group]), when a member's connection has ended, or after wait.
func (f *fleet) waitFor(ctx context.Context, expect []int64, wait time.Duration) {
	var some bool
	for _, n := range expect {
		some = some || n > 0
	}
	if !some {
		return
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		complete := true
		for i := range f.members {
			if m := f.members[i].Load(); m != nil && m.distinct.Load() < expect[m.group] && m.c.Err() == nil {
				complete = false
				break
			}
		}
		if complete {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// report is what one worker saw. Counts add up across workers; see merge.
type report struct {
	Connected    int64    `json:"connected"`
	Failed       int64    `json:"failed"`
	Disconnected int64    `json:"disconnected"` // connections that ended before the bench closed them
	Errors       []string `json:"errors,omitempty"`
	// Lanes counts distinct deliveries by clientpb.Lane.
	Lanes      [4]int64 `json:"lanes"`
	Dup        int64    `json:"dup"`
	Leaked     int64    `json:"leaked"`      // receipts outside a message's audience
	Thinned    int64    `json:"thinned"`     // messages the members' Pushes said were left out
	LiveFrames int64    `json:"live_frames"` // live state frames the raw members received
	Limited    int64    `json:"limited"`     // logins refused for now (4013, 4015), tried again after the server's hint
	Incomplete int64    `json:"incomplete"`  // members that missed some of the expected messages
	// Groups counts the logged-in members by tag group (one group when untargeted), from
	// which the parent computes each message's expected deliveries.
	Groups     []int64 `json:"groups"`
	FirstRecv  int64   `json:"first_recv"` // unix nanoseconds; 0 when nothing arrived
	LastRecv   int64   `json:"last_recv"`
	LoginStart int64   `json:"login_start"`
	LoginEnd   int64   `json:"login_end"`

	Latency      *hdrhistogram.Snapshot `json:"latency"`       // receive - send, µs
	LoginLatency *hdrhistogram.Snapshot `json:"login_latency"` // dispatch + connect + LoginAck, µs

	// CPUSeconds and MaxRSSBytes are the worker process's own usage; zero for in-process work.
	CPUSeconds  float64 `json:"cpu_seconds"`
	MaxRSSBytes int64   `json:"max_rss_bytes"`
}

// awaitAndFinish waits up to wait for every member to have the accepted messages of its
// audience, then closes the clients and reports.
func (f *fleet) awaitAndFinish(ctx context.Context, accepted seqSet, wait time.Duration) report {
	expect := f.spec.tagging().expectedByGroup(accepted)
	f.waitFor(ctx, expect, wait)
	return f.finish(expect)
}

// finish closes every client and reports. expect is how many distinct messages a member of
// each group should have had, to count the incomplete ones.
func (f *fleet) finish(expect []int64) report {
	var r report
	for i := range f.members {
		if m := f.members[i].Load(); m != nil && m.c.Err() != nil {
			r.Disconnected++
			f.addError(fmt.Errorf("client %d disconnected: %w", m.idx, m.c.Err()))
		}
	}
	f.close()
	r.Connected, r.Failed, r.Limited = f.connected.Load(), f.failed.Load(), f.limited.Load()
	r.Groups = make([]int64, f.spec.tagging().numGroups())
	lat := newLatencyHistogram()
	for i := range f.shards {
		f.shards[i].mu.Lock()
		lat.Merge(f.shards[i].h)
		f.shards[i].mu.Unlock()
	}
	for i := range f.members {
		m := f.members[i].Load()
		if m == nil {
			continue
		}
		for l := range r.Lanes {
			r.Lanes[l] += m.lanes[l]
		}
		r.Dup += m.dup
		r.Leaked += m.leaked
		r.Thinned += m.thinned
		if rc, ok := m.c.(*rawClient); ok {
			r.LiveFrames += rc.liveFrames.Load()
		}
		r.Groups[m.group]++
		if m.group < len(expect) && m.distinct.Load() < expect[m.group] {
			r.Incomplete++
		}
		if m.first != 0 && (r.FirstRecv == 0 || m.first < r.FirstRecv) {
			r.FirstRecv = m.first
		}
		r.LastRecv = max(r.LastRecv, m.last)
	}
	r.Latency = lat.Export()
	f.mu.Lock()
	r.Errors = append([]string(nil), f.errors...)
	r.LoginLatency = f.loginLat.Export()
	if !f.loginStart.IsZero() {
		r.LoginStart, r.LoginEnd = f.loginStart.UnixNano(), f.loginEnd.UnixNano()
	}
	f.mu.Unlock()
	return r
}

// rawHeartbeatTick is how often the fleet looks for raw members whose heartbeat is due. Each
// member beats at the interval the server last gave it (LoginAck, then each HeartbeatAck), as
// an sdk.Client does, counted from its login, so the beats are spread as the logins were: a
// bench that beat more often than real clients would charge the server for frames they do not
// send (at a fixed 10 s, against the server's 25-60 s, they were about 9% of a big room's
// server CPU).
const rawHeartbeatTick = 100 * time.Millisecond

// heartbeats beats for every raw member whose beat is due until close (sdk.Clients beat by
// themselves).
func (f *fleet) heartbeats() {
	t := time.NewTicker(rawHeartbeatTick)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		for i := range f.members {
			if m := f.members[i].Load(); m != nil {
				if rc, ok := m.c.(*rawClient); ok && now >= rc.nextBeat && rc.Err() == nil {
					rc.nextBeat = now + rc.beatEvery.Load()
					rc.heartbeat()
				}
			}
		}
	}
}

// close ends every client, a few at a time (a WebSocket close waits briefly for its close
// frame to go out).
func (f *fleet) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range f.members {
		m := f.members[i].Load()
		if m == nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m.c.Close()
		})
	}
	wg.Wait()
	if f.pollers != nil {
		f.pollers.stop()
	}
	f.hc.CloseIdleConnections()
}

// dialRawLimited dials raw member i like the SDK's Dial does: a login the server refuses for
// now (Kick 4013 or 4015, or a WebSocket upgrade refused with 429) is tried again after the
// server's hint plus a random part that grows with the attempts (up to 5 s), so that a bench
// through the node's login and join limits loses nobody; until ctx ends.
func (f *fleet) dialRawLimited(ctx context.Context, tok string, m *member) (*rawClient, error) {
	hooks := rawHooks{liveState: f.spec.LiveState, onThinned: func(n int64) { m.thinned += n }}
	if f.uploads != nil {
		hooks.onAnswer = f.uploads.answer
	}
	if f.likes != nil {
		hooks.onLikeRefused = f.likes.refuse
	}
	for attempt := 1; ; attempt++ {
		c, err := dialRaw(ctx, f.hc, f.spec.Dispatcher, f.spec.Transport, tok, DialerFrom(sourceAddr(m.idx)), f.tls, f.pollers, m.receiveBody, hooks)
		var ce *sdk.CloseError
		if err == nil || !errors.As(err, &ce) || !ce.Limited() {
			return c, err
		}
		f.limited.Add(1)
		jitter := min(5*time.Second, 100*time.Millisecond<<min(attempt-1, 6))
		t := time.NewTimer(ce.RetryAfter + rand.N(jitter))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}
