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
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lxzan/gws"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/chatlink/internal/uring"
	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/netpoll"
	"roomcast/proto/clientpb"
	"roomcast/store/inbox"
	"roomcast/tag"
)

// wsReadBuffer is the read buffer each client connection keeps (WebSocket and TCP): small, since client frames
// are small and rare next to what the node writes.
const wsReadBuffer = 256

// Node is one ChatLink.
//
// Lock order, where locks nest (one on the left may be held while taking one on its right,
// never the other way round):
//
//	sessionStream.mu -> eventBatcher.mu -> connTable's shard locks (a snapshot), conn.mu
//	sessionStream.mu -> roomShard.mu -> roomFanout.mu -> localRoom.mu -> a member's writer
//	sessionStream.mu -> conn.mu -> the tag interner's lock
//	roomShard.mu -> roomCounters.mu
//
// where a member's writer is sockWriter.mu, polled.sockMu and polled.mu, or tcpTransport.mu
// (localRoom.write closes slow readers while it reads the room). Every other lock is taken
// alone.
type Node struct {
	cfg        Config
	log        *slog.Logger
	audit      *slog.Logger // cfg.Audit, naming the node and the audit trail
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
	tags       *tag.Interner  // members' tag sets, shared by identical sets
	exprs      *tag.Cache     // compiled tag expressions
	inbox      *inboxState    // users' stored at-least-once messages (inbox.go)
	limits     *limiter       // rates, connections per address, address lists (limits.go)
	pace       *loginPacer    // the node's login pace (loginpace.go)
	histReads  *historyReads  // recoveries' reads of their rooms' history, shared (historyread.go)
	counters   *counterSums   // the rooms' counter adds not yet answered (counters.go)
	uploads    *uploads       // the rooms' members' sends, a window at a time (upload.go)
	notices    *noticeSpreads // app-wide notices being spread over the rooms (notice.go)

	upgrader *gws.Upgrader
	wsLn     net.Listener
	sse      *sseServer // the HTTP fallback, on wsLn's connections (transport_sse.go)
	tcpLn    net.Listener

	ctx        context.Context // ends at the end of Shutdown
	cancel     context.CancelFunc
	wg         sync.WaitGroup  // every goroutine the node starts
	poll       *netpoll.Poller // tells when client sockets are readable; nil with Config.ReaderGoroutines
	readers    chan *polled    // idle readers take a readable connection here (polled.go)
	rings      *uring.Rings    // io_uring rings for batch sends (batch.go); nil when writes are plain
	ringFailed atomic.Bool     // a batch found no ring and wrote plainly (logged once)

	js       jetstream.JetStream // node lease, history
	adminSub *nats.Subscription
	drained  chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error

	// keys are the token secrets in force: cfg.Keys until SetKeys replaces them.
	keys atomic.Pointer[auth.Keyring]
}

// New checks cfg and returns a node; Start opens its listeners.
func New(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Log.With("node", cfg.Node), audit: cfg.Audit.With("node", cfg.Node, "audit", true)}
	n.keys.Store(&cfg.Keys)
	if n.limits, err = newLimiter(cfg); err != nil {
		return nil, err
	}
	n.pace = newLoginPacer(cfg.Limits)
	n.counters = newCounterSums(n)
	n.m = newMetrics(cfg.Registry, n)
	n.histReads = n.newHistoryReads()
	n.uploads = newUploads(n)
	n.notices = newNoticeSpreads(n)
	n.inbox = newInboxState(n)
	n.flow = newFlowController(cfg.EgressCapacity, cfg.FlowT1, cfg.FlowT2)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.readers = make(chan *polled)
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
		// A close reason, and a text message, that is not UTF-8 fails the connection with
		// 1007 (RFC 6455 8.1), as the poller's reader (wsproto) does.
		CheckUtf8Enabled: true,
		NewSession:       func() gws.SessionStorage { return &wsSlot{} },
	})
	return n, nil
}

// Start opens the listeners and starts serving, reporting load and sweeping dead connections.
// When it fails it leaves nothing behind: no goroutine of the node runs, no listener or
// subscription stays open, the name lease is released, and Shutdown has nothing left to do.
func (n *Node) Start() error {
	if err := n.start(); err != nil {
		n.abortStart()
		return err
	}
	n.log.Info("chatlink started", "ws", n.WSURL(), "tcp", n.TCPAddr())
	return nil
}

// start does Start's work up to its first error; abortStart undoes it.
func (n *Node) start() error {
	n.stream.boot = newBoot()
	if err := n.subscribeControl(); err != nil { // control.go
		return err
	}
	var err error
	// No TCP keepalive on clients' connections: a connection silent past its heartbeats is
	// closed by the node (conn.go), and Go's default keepalive costs four setsockopt calls
	// at every accept, a login storm's hot path.
	lc := net.ListenConfig{KeepAlive: -1}
	if n.wsLn, err = lc.Listen(n.ctx, "tcp", n.cfg.WSListen); err != nil {
		return fmt.Errorf("chatlink: websocket listener: %w", err)
	}
	n.sse = newSSEServer(n)
	if n.tcpLn, err = lc.Listen(n.ctx, "tcp", n.cfg.TCPListen); err != nil {
		return fmt.Errorf("chatlink: tcp listener: %w", err)
	}
	if n.js, err = jetstream.New(n.cfg.Bus); err != nil {
		return fmt.Errorf("chatlink: jetstream: %w", err)
	}
	n.inbox.store = inbox.NewReader(n.js)
	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	lease, err := acquireNameLease(ctx, n)
	cancel()
	if err != nil {
		return err
	}
	n.goAsync(func() { lease.renewLoop(n.ctx, n) }) // releases the lease when n.ctx ends
	if n.adminSub, err = n.cfg.Bus.Subscribe(bus.DrainSubject(n.cfg.Node), n.serveDrain); err != nil {
		return fmt.Errorf("chatlink: admin subject: %w", err)
	}
	if !n.cfg.ReaderGoroutines && netpoll.Supported {
		if n.poll, err = netpoll.New(netpoll.Config{}); err != nil {
			return err
		}
		n.goAsync(n.poll.Run)
		if !n.cfg.PlainWrites {
			if n.rings, err = uring.NewRings(maxRings); err != nil {
				n.log.Warn("io_uring unavailable: writing as with --plain-writes (a system call per frame)", "err", err)
				n.rings = nil
			}
		}
	}
	// Last, as its watcher is stopped only by Run.
	ctx, cancel = context.WithTimeout(n.ctx, 10*time.Second)
	n.limits.apps, err = followAppLimits(ctx, n)
	cancel()
	if err != nil {
		return err
	}
	// Nothing fails from here on: the node reports itself to the services and the dispatcher
	// only now that it will serve.
	n.goAsync(func() { n.limits.apps.Run(n.ctx) })
	n.goAsync(n.sessionReportLoop)
	n.goAsync(n.acceptWS)
	n.goAsync(n.sse.serve)
	n.goAsync(n.acceptTCP)
	n.goAsync(n.loadReportLoop)
	n.goAsync(n.sweepLoop)
	n.goAsync(n.counters.loop)
	n.goAsync(n.viewersLoop)
	n.goAsync(n.presence.loop)
	n.goAsync(n.flowLoop)
	n.goAsync(n.inboxLoop)
	n.goAsync(n.noticeLoop)
	if n.cfg.IPListFile != "" {
		// Wired before Start returns, so that a SIGHUP right after it is not lost.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		n.goAsync(func() { n.ipListLoop(hup) })
	}
	return nil
}

// abortStart undoes what start did before it failed, and marks the node shut down.
func (n *Node) abortStart() {
	n.shutdownOnce.Do(func() {
		n.draining.Store(true)
		n.closeListeners()
		n.unsubscribe()
		n.cancel()
		if n.poll != nil {
			n.poll.Stop()
		}
		n.wg.Wait()
		if n.rings != nil {
			n.rings.Close()
		}
	})
}

// closeListeners closes the listeners Start opened.
func (n *Node) closeListeners() {
	if n.wsLn != nil {
		_ = n.wsLn.Close()
	}
	if n.sse != nil {
		n.sse.close()
	}
	if n.tcpLn != nil {
		_ = n.tcpLn.Close()
	}
}

// unsubscribe ends the node's subscriptions to its admin and control subjects.
func (n *Node) unsubscribe() {
	if n.adminSub != nil {
		_ = n.adminSub.Unsubscribe()
	}
	n.control.unsubscribe()
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

// WSURL returns the WebSocket URL clients connect to: Config.PublicWSURL, or the listener's.
func (n *Node) WSURL() string {
	if n.cfg.PublicWSURL != "" {
		return n.cfg.PublicWSURL
	}
	scheme := "ws://"
	if n.cfg.TLS != nil {
		scheme = "wss://"
	}
	return scheme + n.publicAddr(n.wsLn) + wsPath
}

// TCPAddr returns the host:port clients reach the TCP transport at: Config.PublicTCPAddr, or
// the listener's.
func (n *Node) TCPAddr() string {
	if n.cfg.PublicTCPAddr != "" {
		return n.cfg.PublicTCPAddr
	}
	return n.publicAddr(n.tcpLn)
}

// TCPTLS reports whether clients reach the TCP transport over TLS.
func (n *Node) TCPTLS() bool { return n.cfg.TLS != nil || n.cfg.PublicTCPTLS }

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
		if !n.admitTCP(nc) {
			continue
		}
		if n.cfg.TLS != nil {
			n.goAsync(func() { n.startTLSTCP(nc) })
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

// sweepLoop closes connections that did not log in in time or went silent.
func (n *Node) sweepLoop() {
	period := min(time.Second, n.cfg.LoginTimeout/2, n.cfg.HeartbeatInterval/2)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.sweep()
		}
	}
}

// sweep closes the connections that, by the node's clock, did not log in in time or went
// silent.
func (n *Node) sweep() {
	nowNS := n.now().UnixNano()
	loginBy := nowNS - n.cfg.LoginTimeout.Nanoseconds()
	n.conns.each(func(c *conn) {
		if w, ok := c.t.(*sockWriter); ok {
			w.dropIdleCipher()
		}
		switch st := c.getState(); {
		// The login deadline counts from the connect, not from the last frame: a client
		// that pings (or sends anything but a Login) must not stay forever.
		case st == stateNew && c.accepted < loginBy:
			c.close(clientpb.CloseCode_CLOSE_CODE_LOGIN_TIMEOUT, "no login in time")
		case st == stateLive && nowNS-c.lastSeen.Load() > 3*int64(c.hbInterval.Load())*int64(time.Millisecond):
			c.close(clientpb.CloseCode_CLOSE_CODE_HEARTBEAT_TIMEOUT, "no heartbeat in time")
		}
	})
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
		if err := bus.Publish(n.cfg.Bus, bus.SubjectLoad, n.loadReport(0)); err != nil {
			n.log.Warn("final load report not published", "err", err)
		}
	}
	n.conns.each(func(c *conn) { c.close(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN, "node shutting down") })
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
	if n.sse != nil {
		n.sse.close()
	}
	// The members are gone: what they added goes to the room service before the node stops.
	if cerr := n.counters.drain(ctx); cerr != nil {
		n.log.Warn("counter adds lost at shutdown", "err", cerr)
	}
	n.cancel()
	n.control.unsubscribe()
	if n.poll != nil {
		n.poll.Stop()
	}
	n.wg.Wait()
	if n.rings != nil {
		n.rings.Close()
	}
	n.presence.flush()
	n.log.Info("chatlink stopped")
	return err
}

// now reads the node's clock (Config.Now).
func (n *Node) now() time.Time { return n.cfg.Now() }

// SetKeys replaces the token secrets logins are verified with: a login whose token arrives
// after it returns is checked against keys, so a secret left out stops verifying and a new one
// starts. Connections logged in already stay. An empty keyring is refused and the one in
// force stays.
func (n *Node) SetKeys(keys auth.Keyring) error {
	if len(keys) == 0 {
		return errors.New("chatlink: no token secret")
	}
	n.keys.Store(&keys)
	return nil
}
