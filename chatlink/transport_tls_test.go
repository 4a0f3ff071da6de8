package chatlink_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcerts"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// startTLSCluster starts a cluster whose ChatLink serves TLS, and returns a client config that
// trusts its certificate.
func startTLSCluster(t *testing.T, opts ...testcluster.Option) (*devcluster.Cluster, *tls.Config) {
	t.Helper()
	ca := testcerts.NewCA(t)
	certFile, keyFile := ca.Issue(t).Write(t, t.TempDir())
	opts = append([]testcluster.Option{testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.TLS.CertFile, cfg.TLS.KeyFile = certFile, keyFile
	}}, opts...)
	cfg := ca.ClientConfig()
	cfg.ServerName = "localhost"
	return testcluster.Start(t, opts...), cfg
}

// tlsMember is a member logged in over TLS by hand, holding no goroutine of its own: it reads
// only when the test asks.
type tlsMember struct {
	conn net.Conn // the TLS connection
	tls  *tls.Conn
	br   *bufio.Reader
	ws   bool
}

// dialTLSMember connects to the node over TLS with dial (the TCP connection, perhaps slowed),
// upgrades to WebSocket when ws, and logs in as uid.
func dialTLSMember(t *testing.T, c *devcluster.Cluster, cfg *tls.Config, ws bool, uid string, dial func(addr string) (net.Conn, error)) *tlsMember {
	t.Helper()
	return dialTLSMemberAt(t, c.Nodes[0], cfg, ws, uid, dial)
}

// dialTLSMemberAt is dialTLSMember to a node of the cluster's choosing.
func dialTLSMemberAt(t *testing.T, node *chatlink.Node, cfg *tls.Config, ws bool, uid string, dial func(addr string) (net.Conn, error)) *tlsMember {
	t.Helper()
	addr := node.TCPAddr()
	if ws {
		u, err := url.Parse(node.WSURL())
		if err != nil {
			t.Fatal(err)
		}
		addr = u.Host
	}
	raw, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, cfg)
	t.Cleanup(func() { _ = raw.Close() })
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	m := &tlsMember{conn: tc, tls: tc, br: bufio.NewReader(tc), ws: ws}
	if ws {
		if _, err := io.WriteString(tc, "GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		status, err := m.br.ReadString('\n')
		if err != nil || !strings.Contains(status, " 101 ") {
			t.Fatalf("upgrade: %q %v", status, err)
		}
		for line := ""; line != "\r\n"; {
			if line, err = m.br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.send(t, loginFrame(testcluster.Token(t, uid, "tls-room")))
	for {
		f := m.next(t)
		if f.GetLoginAck() != nil {
			break
		}
		if f.GetKick() != nil {
			t.Fatalf("%s kicked: %v", uid, f.GetKick())
		}
	}
	_ = tc.SetDeadline(time.Time{})
	return m
}

// send writes one frame: masked in a WebSocket frame, or length-prefixed.
func (m *tlsMember) send(t *testing.T, f *clientpb.Frame) {
	t.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	if m.ws {
		wire = append([]byte{0x82, 0x80 | 126}, binary.BigEndian.AppendUint16(nil, uint16(len(b)))...)
		wire = append(wire, 0, 0, 0, 0) // a zero mask leaves the payload as it is
	} else {
		wire = binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	}
	if _, err := m.conn.Write(append(wire, b...)); err != nil {
		t.Fatal(err)
	}
}

// next reads one frame from the server.
func (m *tlsMember) next(t *testing.T) *clientpb.Frame {
	t.Helper()
	_ = m.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var size int
	if m.ws {
		var hdr [2]byte
		if _, err := io.ReadFull(m.br, hdr[:]); err != nil {
			t.Fatal(err)
		}
		size = int(hdr[1] & 0x7f)
		switch size {
		case 126:
			var ext [2]byte
			if _, err := io.ReadFull(m.br, ext[:]); err != nil {
				t.Fatal(err)
			}
			size = int(binary.BigEndian.Uint16(ext[:]))
		case 127:
			var ext [8]byte
			if _, err := io.ReadFull(m.br, ext[:]); err != nil {
				t.Fatal(err)
			}
			size = int(binary.BigEndian.Uint64(ext[:]))
		}
	} else {
		var hdr [4]byte
		if _, err := io.ReadFull(m.br, hdr[:]); err != nil {
			t.Fatal(err)
		}
		size = int(binary.BigEndian.Uint32(hdr[:]))
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(m.br, b); err != nil {
		t.Fatal(err)
	}
	var f clientpb.Frame
	if err := proto.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

func plainDial(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }

// settledGoroutines waits until the process's goroutines are at most limit (the node's
// readers end a second after their last read) and fails the test if they never are.
func settledGoroutines(t *testing.T, limit int, what string) {
	t.Helper()
	var n int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= limit {
			return
		}
	}
	t.Fatalf("%s: %d goroutines, want at most %d", what, n, limit)
}

// TestIdleTLSHoldsNoGoroutine: TLS members, over WebSocket and TCP, logged in and idle, hold
// no goroutine on the node; they still get what the room sends, and their sends are read.
func TestIdleTLSHoldsNoGoroutine(t *testing.T) {
	c, cfg := startTLSCluster(t)
	// Warm up: one member of each kind logs in and leaves the node's pools and caches filled.
	for i, ws := range []bool{true, false} {
		m := dialTLSMember(t, c, cfg, ws, fmt.Sprintf("warm-%d", i), plainDial)
		_ = m.conn.Close()
	}
	const perTransport = 30
	base := runtime.NumGoroutine()
	var members []*tlsMember
	for _, ws := range []bool{true, false} {
		for i := range perTransport {
			members = append(members, dialTLSMember(t, c, cfg, ws, fmt.Sprintf("idle-%v-%d", ws, i), plainDial))
		}
	}
	// A goroutine per connection would be 60 more; some slack for the node's own timers.
	settledGoroutines(t, base+10, fmt.Sprintf("%d idle TLS members", len(members)))
	// Every one is served by the node's own record layer (TLS 1.3, AES-GCM), none by crypto/tls.
	if got := tlsConnections(t, c, "roomcast"); got != len(members)+2 {
		t.Errorf("%d connections on the node's record layer, want %d", got, len(members)+2)
	}
	if got := tlsConnections(t, c, "crypto_tls"); got != 0 {
		t.Errorf("%d connections left to crypto/tls", got)
	}
	// Idle for more than two of the node's sweeps: their sending ciphers are let go, and built
	// again for what follows.
	time.Sleep(2500 * time.Millisecond)

	// They are alive: one sends and has it acknowledged, the others get it.
	members[0].send(t, sendFrame(1, "over tls"))
	if f := members[0].next(t); f.GetSendAck().GetSeq() != 1 {
		t.Fatalf("the sender got %v, want its SendAck", f)
	}
	for i, m := range members[1:] {
		for {
			f := m.next(t)
			if ms := f.GetPush().GetMessages(); len(ms) > 0 {
				if string(ms[0].Body) != "over tls" {
					t.Fatalf("member %d got %q", i, ms[0].Body)
				}
				break
			}
		}
	}
}

// TestTLS12StaysWithCryptoTLS: a client that speaks only TLS 1.2 is served by crypto/tls, over
// the same poller and writer, and counted so.
func TestTLS12StaysWithCryptoTLS(t *testing.T) {
	c, cfg := startTLSCluster(t)
	cfg.MaxVersion = tls.VersionTLS12
	a := dialTLSMember(t, c, cfg, true, "old-ws", plainDial)
	b := dialTLSMember(t, c, cfg, false, "old-tcp", plainDial)
	if v := a.tls.ConnectionState().Version; v != tls.VersionTLS12 {
		t.Fatalf("negotiated version %x", v)
	}
	a.send(t, sendFrame(1, "over tls 1.2"))
	if f := a.next(t); f.GetSendAck().GetSeq() != 1 {
		t.Fatalf("the sender got %v, want its SendAck", f)
	}
	for {
		if ms := b.next(t).GetPush().GetMessages(); len(ms) > 0 {
			if string(ms[0].Body) != "over tls 1.2" {
				t.Fatalf("got %q", ms[0].Body)
			}
			break
		}
	}
	if got := tlsConnections(t, c, "crypto_tls"); got != 2 {
		t.Errorf("%d connections left to crypto/tls, want 2", got)
	}
}

// rawTail is a connection that keeps what it read, for a test to look at the records.
type rawTail struct {
	net.Conn
	mu  sync.Mutex
	got []byte
}

func (r *rawTail) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.mu.Lock()
	r.got = append(r.got, b[:n]...)
	r.mu.Unlock()
	return n, err
}

// lastRecord returns the header of the last whole record read.
func (r *rawTail) lastRecord() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last []byte
	for b := r.got; len(b) >= 5; {
		n := 5 + int(binary.BigEndian.Uint16(b[3:5]))
		if n > len(b) {
			break
		}
		last, b = b[:5], b[n:]
	}
	return last
}

// TestTLSCloseNotify: a member the node closes (here for a frame it cannot read) gets its last
// frame, then a close_notify before the end of the stream, over WebSocket and TCP.
func TestTLSCloseNotify(t *testing.T) {
	c, cfg := startTLSCluster(t)
	for _, ws := range []bool{true, false} {
		var raw *rawTail
		m := dialTLSMember(t, c, cfg, ws, fmt.Sprintf("closed-%v", ws), func(addr string) (net.Conn, error) {
			nc, err := plainDial(addr)
			raw = &rawTail{Conn: nc}
			return raw, err
		})
		var bad []byte
		if ws {
			bad = []byte{0x82, 0x80 | 3, 0, 0, 0, 0, 0xff, 0xff, 0xff} // a masked binary frame, not a Frame
		} else {
			bad = []byte{0, 0, 0, 3, 0xff, 0xff, 0xff}
		}
		if _, err := m.conn.Write(bad); err != nil {
			t.Fatal(err)
		}
		_ = m.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.Copy(io.Discard, m.br)
		if err != nil {
			t.Fatalf("ws %v: the stream ended with %v, want a clean end", ws, err)
		}
		// A close_notify: 2 bytes of alert, its type, a 16-byte tag.
		if h := raw.lastRecord(); !bytes.Equal(h, []byte{23, 3, 3, 0, 19}) {
			t.Errorf("ws %v: the last record's header is % x, want a close_notify's 17 03 03 00 13", ws, h)
		}
	}
}

// tlsConnections reads roomcast_chatlink_tls_connections_total{record_layer=layer} from the
// cluster's registry (its /metrics is served over TLS).
func tlsConnections(t *testing.T, c *devcluster.Cluster, layer string) int {
	t.Helper()
	mfs, err := c.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "roomcast_chatlink_tls_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "record_layer" && l.GetValue() == layer {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}

// trickle is a connection whose writes go out a byte at a time when slow, each its own
// segment, and which stops after stopAfter bytes until resume is closed.
type trickle struct {
	net.Conn
	slow      bool
	sent      int
	stopAfter int
	stopped   chan struct{} // closed when the writes stop at stopAfter
	resume    chan struct{}
}

func (c *trickle) Write(b []byte) (int, error) {
	if !c.slow {
		n, err := c.Conn.Write(b)
		c.sent += n
		return n, err
	}
	for i := range b {
		if c.sent == c.stopAfter {
			close(c.stopped)
			<-c.resume
		}
		if _, err := c.Conn.Write(b[i : i+1]); err != nil {
			return i, err
		}
		c.sent++
		time.Sleep(50 * time.Microsecond) // so that the node reads about a byte at a time
	}
	return len(b), nil
}

// TestSlowTLSClient: clients whose TLS bytes come one at a time, handshake and frames, are read
// correctly; while they are stopped in the middle of a record, they hold no goroutine on the
// node.
func TestSlowTLSClient(t *testing.T) {
	c, cfg := startTLSCluster(t)
	const perTransport = 4
	base := runtime.NumGoroutine()
	type slow struct {
		m  *tlsMember
		tr *trickle
	}
	var clients []slow
	for _, ws := range []bool{true, false} {
		for i := range perTransport {
			var tr *trickle
			dial := func(addr string) (net.Conn, error) {
				nc, err := plainDial(addr)
				if err != nil {
					return nil, err
				}
				// The first of each transport shakes hands a byte at a time too.
				tr = &trickle{Conn: nc, slow: i == 0, stopAfter: -1}
				return tr, nil
			}
			m := dialTLSMember(t, c, cfg, ws, fmt.Sprintf("slow-%v-%d", ws, i), dial)
			tr.slow = true
			clients = append(clients, slow{m, tr})
		}
	}
	body := strings.Repeat("slow ", 20)
	sent := make(chan struct{}, len(clients))
	for _, s := range clients {
		s.tr.stopAfter, s.tr.stopped, s.tr.resume = s.tr.sent+20, make(chan struct{}), make(chan struct{})
		go func() { // the client's writer: stopped in the middle of its record until resumed
			defer func() { sent <- struct{}{} }()
			s.m.send(t, sendFrame(7, body))
		}()
		<-s.tr.stopped
	}
	// The node holds part of a record of each; the clients' writers are the goroutines more. A
	// goroutine of the node's per stopped client would be len(clients) more again: the slack
	// under that is for the in-process cluster's own goroutines, which come and go (NATS, the
	// services; CI once counted one more than a slack of 3 for 20 s).
	settledGoroutines(t, base+2*len(clients)-1, fmt.Sprintf("%d clients stopped mid-record", len(clients)))
	for _, s := range clients {
		close(s.tr.resume)
	}
	for range clients {
		<-sent
	}
	for i, s := range clients {
		if f := s.m.next(t); f.GetSendAck().GetSeq() != 7 {
			t.Fatalf("client %d got %v, want the SendAck of the frame it sent a byte at a time", i, f)
		}
	}
}

// TestTLSResumesAcrossChatLinks: ChatLinks that share a ticket secret resume each other's TLS
// sessions, over both transports; without the secret a session resumes only where it began.
func TestTLSResumesAcrossChatLinks(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "tickets")
	if err := os.WriteFile(secret, []byte(strings.Repeat("a shared ticket secret. ", 2)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared secret", false: "no secret"}[shared], func(t *testing.T) {
			c, cfg := startTLSCluster(t, testcluster.ChatLinks(2), func(dc *devcluster.Config) {
				if shared {
					dc.TLS.TicketSecretFile = secret
				}
			})
			for _, ws := range []bool{true, false} {
				cfg := cfg.Clone()
				cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
				first := dialTLSMemberAt(t, c.Nodes[0], cfg, ws, fmt.Sprintf("first-%v", ws), plainDial)
				if first.tls.ConnectionState().DidResume {
					t.Fatal("the first connection resumed a session")
				}
				// Its LoginAck has been read, and with it the tickets sent after the handshake.
				again := dialTLSMemberAt(t, c.Nodes[0], cfg, ws, fmt.Sprintf("again-%v", ws), plainDial)
				if !again.tls.ConnectionState().DidResume {
					t.Fatal("a second connection to the same ChatLink did not resume")
				}
				other := dialTLSMemberAt(t, c.Nodes[1], cfg, ws, fmt.Sprintf("other-%v", ws), plainDial)
				if got := other.tls.ConnectionState().DidResume; got != shared {
					t.Fatalf("resumed on the other ChatLink: %v, want %v", got, shared)
				}
			}
		})
	}
}
