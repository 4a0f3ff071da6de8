package sdk

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// tcpConn carries frames over TCP, each preceded by its length as a 4-byte big-endian integer.
type tcpConn struct {
	nc           net.Conn
	br           *bufio.Reader // used only by serve
	writeTimeout time.Duration
	closed       atomic.Bool

	wmu  sync.Mutex // guards wbuf and serializes writes
	wbuf []byte
}

var _ frameConn = (*tcpConn)(nil)

// dialTCP connects to addr, inside TLS when overTLS.
func dialTCP(ctx context.Context, addr string, overTLS bool, cfg *Config) (*tcpConn, error) {
	nc, err := cfg.Dialer(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if overTLS {
		host, _, _ := net.SplitHostPort(addr)
		if nc, err = handshakeTLS(ctx, nc, host, cfg); err != nil {
			return nil, err
		}
	}
	return newTCPConn(nc, cfg.WriteTimeout), nil
}

func newTCPConn(nc net.Conn, writeTimeout time.Duration) *tcpConn {
	return &tcpConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10), writeTimeout: writeTimeout}
}

func (t *tcpConn) serve(handle func(*clientpb.Frame)) error {
	buf := make([]byte, 4096)
	for {
		f, err := readTCPFrame(t.br, &buf)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				return err
			}
			if t.closed.Load() {
				return net.ErrClosed
			}
			return &CloseError{Code: CodeAbnormalClosure, Err: err}
		}
		handle(f)
	}
}

// readTCPFrame reads one length-prefixed frame from r, reusing *buf for the bytes (proto.Unmarshal
// copies what it keeps).
func readTCPFrame(r io.Reader, buf *[]byte) (*clientpb.Frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrameSize {
		return nil, fmt.Errorf("%w: frame length %d not in 1..%d", ErrProtocol, n, MaxFrameSize)
	}
	if cap(*buf) < int(n) {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	f := new(clientpb.Frame)
	if err := proto.Unmarshal(b, f); err != nil {
		return nil, fmt.Errorf("%w: bad frame: %w", ErrProtocol, err)
	}
	return f, nil
}

// appendTCPFrame appends f with its length prefix to b.
func appendTCPFrame(b []byte, f *clientpb.Frame) ([]byte, error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, f)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b, nil
}

func (t *tcpConn) write(f *clientpb.Frame) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	b, err := appendTCPFrame(t.wbuf[:0], f)
	if err != nil {
		return err
	}
	t.wbuf = b
	if err := t.nc.SetWriteDeadline(time.Now().Add(t.writeTimeout)); err != nil {
		return err
	}
	_, err = t.nc.Write(b)
	// A deadline left set is a runtime timer that wakes the process when it expires: an idle
	// client would wake WriteTimeout after every heartbeat.
	_ = t.nc.SetWriteDeadline(time.Time{})
	if cap(t.wbuf) > 2*MaxFrameSize {
		t.wbuf = nil // do not pin a large buffer after one big message
	}
	return err
}

func (t *tcpConn) close() {
	t.closed.Store(true)
	_ = t.nc.Close()
}
