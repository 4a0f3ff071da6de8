// Package tlswire is the connection a crypto/tls server connection runs over when the
// ChatLink's poller, not a goroutine parked in a read, says when its socket has bytes: a
// net.Conn that hands crypto/tls the TLS records the poller's reads brought, one whole record
// at a time, and never makes it wait or fail when none has come yet.
//
// crypto/tls reads from its net.Conn whenever it wants a record, and any error but a temporary
// one ends the connection for good; whatever it reads past the record it wants stays in its
// own buffer, out of sight. A Wire therefore hands out only the bytes of one record per read
// and, once Poll is called, only records that have arrived whole: a tls.Conn's Read is called
// when HasRecord says one is there, decrypts it from memory, and finds nothing more in its own
// buffer afterwards (its read buffer, sized by the records it is handed, stays as small as
// they are). Before Poll (the handshake and the WebSocket upgrade, on a goroutine of their
// own) a Wire reads and writes its socket as any net.Conn does, still one record at a time,
// so that the bytes the client sent behind its handshake stay here for the poller's first
// read.
//
// It only frames records: it never decrypts, keeps no socket of its own after Poll (the
// owner reads it and calls Append) and closes nothing but the socket it was given, on Close.
package tlswire

import (
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"time"
)

// HeaderLen is the length of a TLS record header: type, version, payload length.
const HeaderLen = 5

// MaxRecord is the largest record crypto/tls accepts (TLS 1.2's limit, 2^14 + 2048 of
// payload); a header announcing more is handed on as it is, for crypto/tls to refuse, instead of
// waiting for that many bytes.
const MaxRecord = HeaderLen + 16384 + 2048

// RecordLen returns the length, header included, of the record that starts b, and false when
// b is shorter than a header.
func RecordLen(b []byte) (int, bool) {
	if len(b) < HeaderLen {
		return 0, false
	}
	return HeaderLen + int(binary.BigEndian.Uint16(b[3:])), true
}

// Whole reports whether b starts with a whole record, or with a header crypto/tls refuses
// (one announcing more than MaxRecord), which it must see to refuse.
func Whole(b []byte) bool {
	n, ok := RecordLen(b)
	return ok && (n > MaxRecord || len(b) >= n)
}

// ErrWouldBlock is what a polled Wire's Read returns when no whole record is buffered. It is a
// temporary net.Error, which crypto/tls passes on without ending the connection.
var ErrWouldBlock error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "tlswire: no whole record buffered" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

var _ net.Error = wouldBlock{}

// readChunk is how much a Wire reads from its socket at once before Poll.
const readChunk = 2048

// Wire is a net.Conn under a tls.Conn. Its reads and its writes may run at once (crypto/tls
// locks each direction apart); Append, HasRecord and Settle run on the goroutine that reads.
type Wire struct {
	sock net.Conn

	// The read side.
	in       []byte // ciphertext not yet handed to crypto/tls
	left     int    // bytes of the record being handed on still to hand; 0 at a boundary
	borrowed bool   // in is the caller's buffer (Append), until Settle
	polled   bool   // Read never waits: it hands whole records from in only

	// write receives every record crypto/tls writes once polled (set by Poll before the
	// connection is shared).
	write func(b []byte)
}

var _ net.Conn = (*Wire)(nil)

// New returns a Wire over sock.
func New(sock net.Conn) *Wire { return &Wire{sock: sock} }

// Poll makes the Wire read only what Append gave it, and hand every record crypto/tls writes
// to write, which must copy it (crypto/tls reuses the buffer). Call it after the handshake,
// before the poller reads the socket.
func (w *Wire) Poll(write func(b []byte)) {
	w.polled = true
	w.write = write
}

// Append adds bytes read from the socket. buf may be the caller's reusable buffer: it is
// borrowed until Settle.
func (w *Wire) Append(buf []byte) {
	if len(w.in) == 0 {
		w.in, w.borrowed = buf, true
		return
	}
	w.in = append(w.in, buf...)
}

// HasRecord reports whether a whole record (or a header crypto/tls must refuse) is buffered:
// whether a tls.Conn's Read will find one.
func (w *Wire) HasRecord() bool { return w.left > 0 || Whole(w.in) }

// AtBoundary reports whether nothing of a record has been handed on without the rest: where
// the reading of c's records may pass from crypto/tls to a Session (Detach).
func (w *Wire) AtBoundary() bool { return w.left == 0 }

// Next takes the next whole record buffered, header included, for a Session to open (of a
// header announcing more than MaxRecord, the header alone, for Open to refuse), and returns
// false when none is whole. The record may lie in the buffer last given to Append: it is to
// be used before that buffer is.
func (w *Wire) Next() ([]byte, bool) {
	if w.left != 0 || !Whole(w.in) {
		return nil, false
	}
	n, _ := RecordLen(w.in)
	if n > len(w.in) {
		n = HeaderLen
	}
	rec := w.in[:n:n]
	w.in = w.in[n:]
	if len(w.in) == 0 {
		w.in, w.borrowed = nil, false
	}
	return rec, true
}

// Buffered returns how many received bytes crypto/tls has not been handed yet.
func (w *Wire) Buffered() int { return len(w.in) }

// Settle ends a read: it lets go of a borrowed buffer, keeping a copy of what remains (part
// of a record), and releases the buffer when nothing remains.
func (w *Wire) Settle() {
	switch {
	case len(w.in) == 0:
		w.in, w.borrowed = nil, false
	case w.borrowed || cap(w.in) > 2*len(w.in)+readChunk:
		w.in, w.borrowed = slices.Clone(w.in), false
	}
}

// Read hands crypto/tls the bytes of the record at hand, never past it. Polled, it hands only
// a record that is whole, and returns ErrWouldBlock when none is; before, it reads the socket
// when it needs more.
func (w *Wire) Read(p []byte) (int, error) {
	for {
		if w.left == 0 && (Whole(w.in) || !w.polled && len(w.in) >= HeaderLen) {
			w.left, _ = RecordLen(w.in)
		}
		if w.left > 0 && len(w.in) > 0 {
			n := copy(p, w.in[:min(w.left, len(w.in))])
			w.in = w.in[n:]
			w.left -= n
			if len(w.in) == 0 {
				w.in, w.borrowed = nil, false
			}
			return n, nil
		}
		if w.polled {
			return 0, ErrWouldBlock
		}
		if err := w.fill(); err != nil {
			return 0, err
		}
	}
}

// fill reads the socket once, waiting, into in.
func (w *Wire) fill() error {
	if w.borrowed {
		w.in, w.borrowed = slices.Clone(w.in), false
	}
	w.in = slices.Grow(w.in, readChunk)
	n, err := w.sock.Read(w.in[len(w.in):cap(w.in)])
	w.in = w.in[:len(w.in)+n]
	if n > 0 {
		return nil
	}
	if err == nil {
		err = errors.New("tlswire: empty read")
	}
	return err
}

// Write writes a record crypto/tls made: to the socket before Poll, to the owner's write after.
func (w *Wire) Write(b []byte) (int, error) {
	if w.write != nil {
		w.write(b)
		return len(b), nil
	}
	return w.sock.Write(b)
}

// Close closes the socket.
func (w *Wire) Close() error                       { return w.sock.Close() }
func (w *Wire) LocalAddr() net.Addr                { return w.sock.LocalAddr() }
func (w *Wire) RemoteAddr() net.Addr               { return w.sock.RemoteAddr() }
func (w *Wire) SetDeadline(t time.Time) error      { return w.sock.SetDeadline(t) }
func (w *Wire) SetReadDeadline(t time.Time) error  { return w.sock.SetReadDeadline(t) }
func (w *Wire) SetWriteDeadline(t time.Time) error { return w.sock.SetWriteDeadline(t) }
