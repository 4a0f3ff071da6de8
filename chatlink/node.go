// Package chatlink is the edge node: it holds client connections (WebSocket through gws, and
// length-prefixed TCP for native clients), logs clients in with tokens it verifies locally,
// joins them to their room, fans each room's broadcasts out to its local members, and reports
// its load to the dispatcher.
//
// It talks to the room and presence services only over NATS and keeps no state that must
// survive it: what it holds (which connection is where) is soft state it owns.
package chatlink

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lxzan/gws"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// never is the expression a message gets when its tag expression does not compile: it reaches
// no one. The room service refuses such messages, so this only guards against a bad publisher.
var never, _ = tag.Compile("false")

// expr returns the compiled tag expression src.
func (n *Node) expr(src string) *tag.Expr {
	e, err := n.exprs.Get(src)
	if err != nil {
		n.log.Warn("room message with a bad tag expression reaches no one", "expr", src, "err", err)
		return never
	}
	return e
}

// wsReadBuffer is the read buffer each client connection keeps (WebSocket and TCP): small, since client frames
// are small and rare next to what the node writes.
const wsReadBuffer = 256

// Node is one ChatLink.
type Node struct {
	cfg        Config
	log        *slog.Logger
	m          *metrics
	rooms      *roomTable
	conns      *connTable
	presence   *eventBatcher
	stream     sessionStream // session stream and lease (stream.go)
	control    controlState  // node-targeted control: kicks, bans, member lists (control.go)
	sessionSeq atomic.Uint64
	draining   atomic.Bool
	egress     atomic.Uint64 // bytes of push frames handed to connections
	flow       *flowController
	cpu        cpuMeter
	tags       *tag.Interner // members' tag sets, shared by identical sets
	exprs      *tag.Cache    // compiled tag expressions

	upgrader *gws.Upgrader
	wsLn     net.Listener
	tcpLn    net.Listener

	ctx        context.Context // ends at the end of Shutdown
	cancel     context.CancelFunc
	wg         sync.WaitGroup // every goroutine the node starts
	poll       *poller        // tells when client sockets are readable; nil with Config.ReaderGoroutines
	rings      *rings         // io_uring rings for batch sends (batch.go); nil when writes are plain
	ringFailed atomic.Bool    // a batch found no ring and wrote plainly (logged once)

	js       jetstream.JetStream // node lease, history
	adminSub *nats.Subscription
	drained  chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// New checks cfg and returns a node; Start opens its listeners.
func New(cfg Config) (*Node, error) {
	switch {
	case !auth.ValidName(cfg.Node):
		return nil, fmt.Errorf("chatlink: node name %q must be 1-128 characters of A-Z a-z 0-9 _ -", cfg.Node)
	case cfg.Bus == nil:
		return nil, errors.New("chatlink: Config.Bus is required")
	case len(cfg.Keys) == 0:
		return nil, errors.New("chatlink: Config.Keys needs at least one app")
	}
	cfg.setDefaults()
	n := &Node{cfg: cfg, log: cfg.Log.With("node", cfg.Node)}
	n.m = newMetrics(cfg.Registry, n)
	n.flow = newFlowController(cfg.EgressCapacity, cfg.FlowT1, cfg.FlowT2)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	// Session numbers start from the boot time in milliseconds, shifted so a node can hand out
	// 65536 sessions a millisecond: a restarted node never repeats an id it gave before.
	n.sessionSeq.Store(uint64(time.Now().UnixMilli()) << 16)
	n.drained = make(chan struct{})
	n.tags = tag.NewInterner()
	n.exprs = tag.NewCache(cfg.ExprCacheSize)
	n.rooms = newRoomTable(n)
	n.conns = newConnTable()
	n.presence = &eventBatcher{n: n}
	n.upgrader = gws.NewUpgrader(wsHandler{n}, &gws.ServerOption{
		ReadBufferSize:     wsReadBuffer,
		ReadMaxPayloadSize: cfg.MaxFrameBytes,
		NewSession:         func() gws.SessionStorage { return &wsSlot{} },
	})
	return n, nil
}

// Start opens the listeners and starts serving, reporting load and sweeping dead connections.
func (n *Node) Start() error {
	if err := n.startControl(); err != nil { // control subjects and the lease loop (control.go)
		return err
	}
	var err error
	if n.wsLn, err = net.Listen("tcp", n.cfg.WSListen); err != nil {
		return fmt.Errorf("chatlink: websocket listener: %w", err)
	}
	if n.tcpLn, err = net.Listen("tcp", n.cfg.TCPListen); err != nil {
		_ = n.wsLn.Close()
		return fmt.Errorf("chatlink: tcp listener: %w", err)
	}
	if n.js, err = jetstream.New(n.cfg.Bus); err != nil {
		_ = n.wsLn.Close()
		_ = n.tcpLn.Close()
		return fmt.Errorf("chatlink: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	lease, err := acquireLease(ctx, n)
	cancel()
	if err != nil {
		_ = n.wsLn.Close()
		_ = n.tcpLn.Close()
		return err
	}
	n.goAsync(func() { lease.keep(n.ctx, n) })
	if n.adminSub, err = n.cfg.Bus.Subscribe(bus.DrainSubject(n.cfg.Node), n.serveDrain); err != nil {
		_ = n.wsLn.Close()
		_ = n.tcpLn.Close()
		return fmt.Errorf("chatlink: admin subject: %w", err)
	}
	if !n.cfg.ReaderGoroutines && pollSupported {
		if n.poll, err = newPoller(); err != nil {
			_ = n.wsLn.Close()
			_ = n.tcpLn.Close()
			return err
		}
		n.goAsync(n.poll.run)
		if !n.cfg.PlainWrites {
			if n.rings, err = newRings(); err != nil {
				n.log.Warn("io_uring unavailable: writing as with --plain-writes (a system call per frame)", "err", err)
				n.rings = nil
			}
		}
	}
	n.goAsync(n.acceptWS)
	n.goAsync(n.acceptTCP)
	n.goAsync(n.reportLoop)
	n.goAsync(n.sweepLoop)
	n.goAsync(n.presence.loop)
	n.goAsync(n.flowLoop)
	n.log.Info("chatlink started", "ws", n.WSURL(), "tcp", n.TCPAddr())
	return nil
}

// goAsync runs f in a goroutine the node waits for in Shutdown.
func (n *Node) goAsync(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Node }

// WSURL returns the WebSocket URL clients connect to.
func (n *Node) WSURL() string { return "ws://" + n.publicAddr(n.wsLn) + "/v1/ws" }

// TCPAddr returns the host:port of the TCP transport.
func (n *Node) TCPAddr() string { return n.publicAddr(n.tcpLn) }

func (n *Node) publicAddr(ln net.Listener) string {
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if n.cfg.PublicHost != "" {
		host = n.cfg.PublicHost
	}
	return net.JoinHostPort(host, port)
}

func (n *Node) acceptTCP() {
	for {
		nc, err := n.tcpLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			n.log.Warn("tcp accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok && n.poll != nil { // Go sets TCP_NODELAY on every TCPConn
			n.goAsync(func() { n.startPolledTCP(tc) })
			continue
		}
		// Not n.goAsync, for the reader's stack (see serveWSReader); serveTCP tells n.wg when done.
		n.wg.Add(1)
		go n.serveTCP(nc)
	}
}

// Connections returns the number of open client connections.
func (n *Node) Connections() int { return n.conns.len() }

// report describes the node for the dispatcher; busRTT is the last measured round trip to
// NATS (zero: not measured).
func (n *Node) report(busRTT time.Duration) *pb.LoadReport {
	return &pb.LoadReport{
		Node:                      n.cfg.Node,
		WsUrl:                     n.WSURL(),
		TcpAddr:                   n.TCPAddr(),
		Region:                    n.cfg.Region,
		Isp:                       n.cfg.ISP,
		Connections:               int64(n.conns.len()),
		MaxConnections:            int64(n.cfg.MaxConnections),
		Rooms:                     int64(n.rooms.count()),
		EgressBytesPerSec:         int64(n.flow.egressRate()),
		EgressCapacityBytesPerSec: int64(n.cfg.EgressCapacity),
		FlowControlStrength:       n.flow.strength(),
		Cpu:                       n.cpu.usage(),
		Draining:                  n.draining.Load(),
		TimeMs:                    time.Now().UnixMilli(),

		BusRttUs:         busRTT.Microseconds(),
		ReportIntervalMs: n.cfg.ReportInterval.Milliseconds(),
	}
}

// measureBusRTT times a NATS ping, bounded by the report interval so a slow bus delays
// neither the next report nor shutdown. It returns zero when the ping fails.
func (n *Node) measureBusRTT() time.Duration {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ReportInterval)
	defer cancel()
	start := time.Now()
	if err := n.cfg.Bus.FlushWithContext(ctx); err != nil {
		return 0
	}
	return max(time.Since(start), time.Microsecond)
}

func (n *Node) reportLoop() {
	t := time.NewTicker(n.cfg.ReportInterval)
	defer t.Stop()
	for {
		var backlog int64
		n.conns.each(func(c *conn) { backlog += c.t.pending() })
		n.m.backlogBytes.Set(float64(backlog))
		if err := bus.Publish(n.cfg.Bus, bus.SubjectLoad, n.report(n.measureBusRTT())); err != nil {
			n.log.Warn("load report not published", "err", err)
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepLoop closes connections that did not log in in time or went silent.
func (n *Node) sweepLoop() {
	period := min(time.Second, n.cfg.LoginTimeout/2, n.cfg.HeartbeatInterval/2)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case now := <-t.C:
			nowNS := now.UnixNano()
			loginBy := nowNS - n.cfg.LoginTimeout.Nanoseconds()
			n.conns.each(func(c *conn) {
				switch st := c.getState(); {
				// The login deadline counts from the connect, not from the last frame: a
				// client that pings (or sends anything but a Login) must not stay forever.
				case st == stateNew && c.accepted < loginBy:
					c.close(pb.CloseCode_CLOSE_CODE_LOGIN_TIMEOUT, "no login in time")
				case st == stateLive && nowNS-c.lastSeen.Load() > 3*int64(c.hbInterval.Load())*int64(time.Millisecond):
					c.close(pb.CloseCode_CLOSE_CODE_HEARTBEAT_TIMEOUT, "no heartbeat in time")
				}
			})
		}
	}
}

// Shutdown stops taking connections, tells every client to reconnect elsewhere, waits for
// them to go (or for ctx to end, then closes them), and stops the node. It may be called more
// than once; later calls return the first call's result.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdownOnce.Do(func() { n.shutdownErr = n.shutdown(ctx) })
	return n.shutdownErr
}

func (n *Node) shutdown(ctx context.Context) error {
	n.draining.Store(true)
	if n.adminSub != nil {
		_ = n.adminSub.Unsubscribe()
	}
	if n.wsLn != nil {
		_ = n.wsLn.Close()
		_ = n.tcpLn.Close()
		if err := bus.Publish(n.cfg.Bus, bus.SubjectLoad, n.report(0)); err != nil {
			n.log.Warn("final load report not published", "err", err)
		}
	}
	n.conns.each(func(c *conn) { c.close(pb.CloseCode_CLOSE_CODE_SHUTDOWN, "node shutting down") })
	var err error
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for n.conns.len() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = fmt.Errorf("chatlink: %d connections still open at the deadline: %w", n.conns.len(), ctx.Err())
			n.conns.each(func(c *conn) { c.t.forceClose() })
		case <-poll.C:
		}
	}
	n.cancel()
	if n.poll != nil {
		n.poll.stop()
	}
	n.wg.Wait()
	if n.rings != nil {
		n.rings.close()
	}
	n.presence.flush()
	n.log.Info("chatlink stopped")
	return err
}

// connTable holds every open connection of a node, sharded to keep accept and close from
// contending.
type connTable struct {
	seed   maphash.Seed
	count  atomic.Int64
	shards [64]struct {
		mu    sync.Mutex // guards conns
		conns map[*conn]struct{}
	}
}

func newConnTable() *connTable {
	t := &connTable{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].conns = make(map[*conn]struct{})
	}
	return t
}

func (t *connTable) shardOf(c *conn) int { return int(maphash.Comparable(t.seed, c) % 64) }

func (t *connTable) add(c *conn) {
	sh := &t.shards[t.shardOf(c)]
	sh.mu.Lock()
	sh.conns[c] = struct{}{}
	sh.mu.Unlock()
	t.count.Add(1)
}

func (t *connTable) remove(c *conn) {
	sh := &t.shards[t.shardOf(c)]
	sh.mu.Lock()
	if _, ok := sh.conns[c]; ok {
		delete(sh.conns, c)
		t.count.Add(-1)
	}
	sh.mu.Unlock()
}

func (t *connTable) len() int { return int(t.count.Load()) }

// each calls f for every connection; f runs without the table's locks held.
func (t *connTable) each(f func(*conn)) {
	var batch []*conn
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		batch = batch[:0]
		for c := range sh.conns {
			batch = append(batch, c)
		}
		sh.mu.Unlock()
		for _, c := range batch {
			f(c)
		}
	}
}

// eventBatcher collects presence events and publishes them in batches.
type eventBatcher struct {
	n *Node

	mu      sync.Mutex // guards pending
	pending []*pb.SessionEvent
}

const presenceFlushEvery = 100 * time.Millisecond

func (b *eventBatcher) add(ev *pb.SessionEvent) {
	b.mu.Lock()
	b.pending = append(b.pending, ev)
	b.mu.Unlock()
}

func (b *eventBatcher) loop() {
	t := time.NewTicker(presenceFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-b.n.ctx.Done():
			return
		case <-t.C:
			b.flush()
		}
	}
}

func (b *eventBatcher) flush() {
	// Session stream hook (stream.go): events, snapshots and reports share one ordered sequence.
	b.n.stream.mu.Lock()
	defer b.n.stream.mu.Unlock()
	b.flushLocked()
}

func nowNano() int64 { return time.Now().UnixNano() }
