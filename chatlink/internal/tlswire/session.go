package tlswire

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
	"reflect"
	"slices"
	"unsafe"
)

// A tls.Conn keeps, for the life of a connection, the whole state of its handshake's outcome:
// the Conn itself (872 bytes) and an AES-GCM state for each direction (about 900 bytes each,
// key schedules and GCM tables), though an idle connection uses none of it. A Session is what
// a TLS 1.3 connection needs after its handshake, and no more: each direction's traffic
// secret, key, IV and sequence number, about 300 bytes, with the AEADs built from the keys
// when a record is sealed or opened and let go again when the connection is idle (DropIn,
// DropIdleOut).
//
// It is the record layer of RFC 8446 section 5 for the AES-GCM suites: application data in,
// application data out, and the post-handshake messages a server meets: a KeyUpdate (answered
// when the peer asks, RFC 8446 section 4.6.3), alerts (close_notify ends the stream, any other
// ends the connection). Detach takes over a tls.Conn whose handshake is done, reading the
// secrets and sequence numbers from its unexported fields, found by name and type when the
// package starts; when a Go release changes them, or the connection is not TLS 1.3 with an
// AES-GCM suite, or it holds bytes not yet read, Detach declines and the tls.Conn carries on.

// Content types (RFC 8446 section 5.1).
const (
	typeAlert     = 21
	typeHandshake = 22
	typeData      = 23
)

// maxPlain is the most content a record carries; maxCipher the longest payload a TLS 1.3 peer
// may send (RFC 8446 section 5.2).
const (
	maxPlain  = 1 << 14
	maxCipher = maxPlain + 256
)

// maxUseless is how many records in a row may carry no application data (key updates, empty
// records) before the peer is taken for a flood, as crypto/tls does.
const maxUseless = 16

// Alert is a TLS alert description. Open's errors are Alerts: the alert to send the peer
// before closing (SealAlert), or, for a peer's own alert, RemoteAlert.
type Alert uint8

// The alerts Open sends (RFC 8446 section 6).
const (
	AlertCloseNotify       Alert = 0
	AlertUnexpectedMessage Alert = 10
	AlertBadRecordMAC      Alert = 20
	AlertRecordOverflow    Alert = 22
	AlertDecodeError       Alert = 50
)

func (a Alert) Error() string { return fmt.Sprintf("tlswire: alert %d to send", uint8(a)) }

// RemoteAlert is the error of a record that was the peer's alert (other than close_notify,
// which Open reports as io.EOF): nothing is sent back.
type RemoteAlert uint8

func (a RemoteAlert) Error() string { return fmt.Sprintf("tlswire: the peer sent alert %d", uint8(a)) }

// half is one direction's keys.
type half struct {
	secret [sha512.Size384]byte // the traffic secret, of the suite's hash size
	key    [32]byte             // of the suite's key size
	iv     [12]byte
	seq    uint64
	aead   cipher.AEAD // built from key on use; nil while idle
	used   bool        // sealed since the last DropIdleOut
}

// Session is a TLS 1.3 connection's record layer after its handshake. Open and DropIn are
// called by the connection's one reader; Seal, SealAlert, SealKeyUpdate and DropIdleOut by
// its writers, under a lock of theirs. Open's key update touches only the reading side.
type Session struct {
	hash    func() hash.Hash
	hashLen uint8
	keyLen  uint8
	useless uint8  // records in a row with no application data
	hs      []byte // a post-handshake message not whole yet
	in, out half
}

// suite is what Session needs of a cipher suite.
type suite struct {
	hash    func() hash.Hash
	hashLen int
	keyLen  int
}

var suites = map[uint16]suite{
	tls.TLS_AES_128_GCM_SHA256: {sha256.New, sha256.Size, 16},
	tls.TLS_AES_256_GCM_SHA384: {sha512.New384, sha512.Size384, 32},
}

// halfFields are the offsets, in a tls.Conn, of what Detach reads: the two directions
// (halfConn) and, in one, the sequence number, the traffic secret, and the next cipher (which
// must be unset).
var halfFields = func() (f struct {
	ok                                  bool
	in, out, seq, secret, next, sendBuf uintptr
}) {
	t := reflect.TypeFor[tls.Conn]()
	in, ok1 := t.FieldByName("in")
	out, ok2 := t.FieldByName("out")
	sendBuf, ok3 := t.FieldByName("sendBuf")
	if !ok1 || !ok2 || !ok3 || in.Type != out.Type || sendBuf.Type != reflect.TypeFor[[]byte]() {
		return f
	}
	seq, ok1 := in.Type.FieldByName("seq")
	secret, ok2 := in.Type.FieldByName("trafficSecret")
	next, ok3 := in.Type.FieldByName("nextCipher")
	if !ok1 || !ok2 || !ok3 || seq.Type != reflect.TypeFor[[8]byte]() || secret.Type != reflect.TypeFor[[]byte]() ||
		next.Type != reflect.TypeFor[any]() {
		return f
	}
	f.ok = connFields.ok
	f.in, f.out, f.sendBuf = in.Offset, out.Offset, sendBuf.Offset
	f.seq, f.secret, f.next = seq.Offset, secret.Offset, next.Offset
	return f
}()

// Detach returns the record layer of c, a server or client connection whose handshake is
// done, for its owner to use instead of c from then on (c must not be read or written again),
// or false when c cannot be taken over: not TLS 1.3 with an AES-GCM suite, bytes read and not
// yet handed out, records not yet flushed, or a Go release whose crypto/tls this package does
// not know. Call it where no Read, Write or Handshake of c runs.
func Detach(c *tls.Conn) (*Session, bool) {
	if !halfFields.ok {
		return nil, false
	}
	st := c.ConnectionState()
	s, ok := suites[st.CipherSuite]
	if !ok || !st.HandshakeComplete || st.Version != tls.VersionTLS13 {
		return nil, false
	}
	base := unsafe.Pointer(c)
	if holding(c) || len(*(*[]byte)(unsafe.Add(base, halfFields.sendBuf))) != 0 {
		return nil, false
	}
	ses := &Session{hash: s.hash, hashLen: uint8(s.hashLen), keyLen: uint8(s.keyLen)}
	for _, d := range []struct {
		off uintptr
		h   *half
	}{{halfFields.in, &ses.in}, {halfFields.out, &ses.out}} {
		hc := unsafe.Add(base, d.off)
		if *(*any)(unsafe.Add(hc, halfFields.next)) != nil {
			return nil, false
		}
		secret := *(*[]byte)(unsafe.Add(hc, halfFields.secret))
		if len(secret) != s.hashLen {
			return nil, false
		}
		seq := *(*[8]byte)(unsafe.Add(hc, halfFields.seq))
		ses.setSecret(d.h, secret)
		d.h.seq = binary.BigEndian.Uint64(seq[:])
	}
	return ses, true
}

// setSecret makes secret h's traffic secret, derives its key and IV (RFC 8446 section 7.3),
// and starts its sequence over.
func (s *Session) setSecret(h *half, secret []byte) {
	copy(h.secret[:], secret)
	copy(h.key[:], s.expandLabel(secret, "key", int(s.keyLen)))
	copy(h.iv[:], s.expandLabel(secret, "iv", len(h.iv)))
	h.seq, h.aead = 0, nil
}

// update moves h to its next traffic secret (RFC 8446 section 7.2).
func (s *Session) update(h *half) {
	s.setSecret(h, s.expandLabel(h.secret[:s.hashLen], "traffic upd", int(s.hashLen)))
}

// expandLabel is HKDF-Expand-Label with an empty context (RFC 8446 section 7.1).
func (s *Session) expandLabel(secret []byte, label string, n int) []byte {
	info := make([]byte, 0, 4+6+len(label))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(6+len(label)))
	info = append(info, "tls13 "...)
	info = append(info, label...)
	info = append(info, 0)
	out, err := hkdf.Expand(s.hash, secret, string(info), n)
	if err != nil { // only for a length HKDF cannot give, never one of these
		panic(err)
	}
	return out
}

// cipher returns h's AEAD, building it if it was let go.
func (s *Session) cipher(h *half) cipher.AEAD {
	if h.aead == nil {
		block, err := aes.NewCipher(h.key[:s.keyLen])
		if err != nil {
			panic(err) // a key of 16 or 32 bytes: never
		}
		if h.aead, err = cipher.NewGCM(block); err != nil {
			panic(err)
		}
	}
	return h.aead
}

// nonce returns h's nonce for its next record: the IV with the sequence number XORed into its
// last 8 bytes (RFC 8446 section 5.3).
func (h *half) nonce() (n [12]byte) {
	n = h.iv
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], h.seq)
	for i, b := range seq {
		n[4+i] ^= b
	}
	return n
}

// Seal appends to dst the records carrying plain as application data, at most 16 KiB of it
// each, and returns the extended buffer.
func (s *Session) Seal(dst, plain []byte) []byte {
	for len(plain) > 0 {
		k := min(len(plain), maxPlain)
		dst = s.seal(dst, typeData, plain[:k])
		plain = plain[k:]
	}
	return dst
}

// SealAlert appends the record of an alert that ends the connection (or, for
// AlertCloseNotify, says the sender has finished).
func (s *Session) SealAlert(dst []byte, a Alert) []byte {
	level := byte(2) // fatal
	if a == AlertCloseNotify {
		level = 1
	}
	return s.seal(dst, typeAlert, []byte{level, byte(a)})
}

// SealKeyUpdate appends a KeyUpdate that asks nothing of the peer (the answer Open asks for)
// and moves the sending side to its next keys.
func (s *Session) SealKeyUpdate(dst []byte) []byte {
	dst = s.seal(dst, typeHandshake, []byte{typeKeyUpdate, 0, 0, 1, 0})
	s.update(&s.out)
	return dst
}

// seal appends one record of content of type typ.
func (s *Session) seal(dst []byte, typ byte, content []byte) []byte {
	h := &s.out
	aead := s.cipher(h)
	n := len(content) + 1 + aead.Overhead()
	start := len(dst)
	dst = slices.Grow(dst, HeaderLen+n)
	dst = append(dst, typeData, 3, 3, byte(n>>8), byte(n)) // every TLS 1.3 record says application data
	dst = append(dst, content...)
	dst = append(dst, typ)
	nonce := h.nonce()
	inner := dst[start+HeaderLen:]
	aead.Seal(inner[:0], nonce[:], inner, dst[start:start+HeaderLen]) // in place, within dst's capacity
	dst = dst[:start+HeaderLen+n]
	h.seq++
	h.used = true
	return dst
}

// typeKeyUpdate is the handshake message type of a KeyUpdate.
const typeKeyUpdate = 24

// Open decrypts rec, one whole record from the peer (header included, as Wire.Next returns
// it), in place, and returns the application data it carried (perhaps none). answer is true
// when the record was a KeyUpdate asking for one back: the caller seals one (SealKeyUpdate)
// before its next record. The error is io.EOF for the peer's close_notify, a RemoteAlert for
// another of its alerts, or the Alert to send it before closing.
func (s *Session) Open(rec []byte) (data []byte, answer bool, err error) {
	n, ok := RecordLen(rec)
	switch {
	case !ok:
		return nil, false, AlertDecodeError
	case n-HeaderLen > maxCipher:
		return nil, false, AlertRecordOverflow
	case n != len(rec):
		return nil, false, AlertDecodeError
	case rec[0] != typeData: // after the handshake, every record is protected
		return nil, false, AlertUnexpectedMessage
	}
	h := &s.in
	aead := s.cipher(h)
	if n-HeaderLen < aead.Overhead()+1 {
		return nil, false, AlertBadRecordMAC
	}
	nonce := h.nonce()
	payload := rec[HeaderLen:]
	plain, err := aead.Open(payload[:0], nonce[:], payload, rec[:HeaderLen])
	if err != nil {
		return nil, false, AlertBadRecordMAC
	}
	h.seq++
	i := len(plain) - 1
	for i >= 0 && plain[i] == 0 { // the padding
		i--
	}
	if i < 0 {
		return nil, false, AlertUnexpectedMessage
	}
	typ, plain := plain[i], plain[:i]
	if len(plain) > maxPlain {
		return nil, false, AlertRecordOverflow
	}
	if typ == typeData && len(plain) > 0 {
		s.useless = 0
		return plain, false, nil
	}
	if s.useless++; s.useless > maxUseless {
		return nil, false, AlertUnexpectedMessage
	}
	switch typ {
	case typeData:
		return nil, false, nil
	case typeAlert:
		switch {
		case len(plain) != 2:
			return nil, false, AlertDecodeError
		case Alert(plain[1]) == AlertCloseNotify:
			return nil, false, io.EOF
		}
		return nil, false, RemoteAlert(plain[1])
	case typeHandshake:
		return s.handshake(plain)
	}
	return nil, false, AlertUnexpectedMessage
}

// handshake takes the bytes of a post-handshake message: a server accepts only KeyUpdate
// (it sends no CertificateRequest, so no client sends it a Certificate).
func (s *Session) handshake(b []byte) (data []byte, answer bool, err error) {
	if len(s.hs)+len(b) > 64 { // a KeyUpdate is 5 bytes
		return nil, false, AlertUnexpectedMessage
	}
	s.hs = append(s.hs, b...)
	if len(s.hs) < 4 {
		return nil, false, nil
	}
	n := int(s.hs[1])<<16 | int(s.hs[2])<<8 | int(s.hs[3])
	switch {
	case s.hs[0] != typeKeyUpdate:
		return nil, false, AlertUnexpectedMessage
	case n != 1 || len(s.hs) > 5:
		return nil, false, AlertDecodeError
	case len(s.hs) < 5:
		return nil, false, nil
	case s.hs[4] > 1:
		return nil, false, AlertDecodeError
	}
	answer = s.hs[4] == 1
	s.hs = nil
	s.update(&s.in)
	return nil, answer, nil
}

// DropIn lets the reading side's AEAD go; the next Open builds it again.
func (s *Session) DropIn() { s.in.aead = nil }

// DropIdleOut lets the sending side's AEAD go when nothing was sealed since the last call.
func (s *Session) DropIdleOut() {
	if !s.out.used {
		s.out.aead = nil
	}
	s.out.used = false
}
