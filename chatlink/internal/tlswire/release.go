package tlswire

import (
	"bytes"
	"crypto/tls"
	"reflect"
	"unsafe"
)

// A tls.Conn keeps, for its life, the buffers its reads grew: rawInput, as large as the
// largest record it was handed plus 512 bytes, and hand, as large as the largest handshake
// message (the client's hello, over 1.5 KB with a post-quantum key share); about 3.7 KB of an
// idle connection's memory after the handshake, and the share of the next record read after.
// crypto/tls has no way to give them back, so Release empties them in place when they hold
// nothing: an empty bytes.Buffer without its array is the same empty buffer to crypto/tls,
// which grows it again at its next read. The fields are found by name and type when the
// package starts; if a Go release changes them, Release does nothing (and its test fails).
var connFields = func() (f struct {
	ok                    bool
	rawInput, input, hand uintptr
}) {
	t := reflect.TypeFor[tls.Conn]()
	raw, ok1 := t.FieldByName("rawInput")
	in, ok2 := t.FieldByName("input")
	hand, ok3 := t.FieldByName("hand")
	buf, rdr := reflect.TypeFor[bytes.Buffer](), reflect.TypeFor[bytes.Reader]()
	f.ok = ok1 && ok2 && ok3 && raw.Type == buf && in.Type == rdr && hand.Type == buf
	f.rawInput, f.input, f.hand = raw.Offset, in.Offset, hand.Offset
	return f
}()

// Release gives back the read buffers c holds, when they hold no byte, and reports whether it
// did. Call it only where no Read or Handshake of c runs: between the reads of its one reader.
func Release(c *tls.Conn) bool {
	if !connFields.ok {
		return false
	}
	if holding(c) {
		return false
	}
	raw, in, hand := readBuffers(c)
	*raw, *hand = bytes.Buffer{}, bytes.Buffer{}
	in.Reset(nil)
	return true
}

// readBuffers returns c's read buffers; connFields.ok must be true.
func readBuffers(c *tls.Conn) (raw *bytes.Buffer, in *bytes.Reader, hand *bytes.Buffer) {
	base := unsafe.Pointer(c)
	return (*bytes.Buffer)(unsafe.Add(base, connFields.rawInput)),
		(*bytes.Reader)(unsafe.Add(base, connFields.input)),
		(*bytes.Buffer)(unsafe.Add(base, connFields.hand))
}

// holding reports whether c holds bytes it read and has not handed out; connFields.ok must be
// true.
func holding(c *tls.Conn) bool {
	raw, in, hand := readBuffers(c)
	return raw.Len() != 0 || in.Len() != 0 || hand.Len() != 0
}
