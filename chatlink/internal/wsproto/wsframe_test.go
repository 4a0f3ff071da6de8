package wsproto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// clientFrame encodes one masked client frame.
func clientFrame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	var out []byte
	switch n := len(payload); {
	case n < 126:
		out = []byte{b0, 0x80 | byte(n)}
	case n < 1<<16:
		out = []byte{b0, 0x80 | 126, byte(n >> 8), byte(n)}
	default:
		out = binary.BigEndian.AppendUint64([]byte{b0, 0x80 | 127}, uint64(n))
	}
	mask := []byte{0x12, 0x34, 0x56, 0x78}
	out = append(out, mask...)
	for i, c := range payload {
		out = append(out, c^mask[i%4])
	}
	return out
}

type recorder struct{ got []string }

func (r *recorder) Message(op byte, p []byte) { r.got = append(r.got, fmt.Sprintf("msg%d:%s", op, p)) }
func (r *recorder) Control(op byte, p []byte) { r.got = append(r.got, fmt.Sprintf("ctl%d:%x", op, p)) }

// feed parses stream the way a polled connection does, handing it over in pieces of at most chunk bytes
// and keeping what is incomplete.
func feed(t *testing.T, stream []byte, chunk int) ([]string, *ProtocolError) {
	t.Helper()
	r := Reader{Max: 70000}
	h := &recorder{}
	var pending []byte
	for len(stream) > 0 {
		k := min(chunk, len(stream))
		data := append(pending, stream[:k]...)
		stream = stream[k:]
		consumed, need, err := r.Parse(data, h)
		if err != nil {
			return h.got, err
		}
		pending = append([]byte(nil), data[consumed:]...)
		if len(pending) > 0 && need < len(pending) && need != MaxHeader {
			t.Fatalf("need %d for %d pending bytes", need, len(pending))
		}
	}
	if len(pending) > 0 {
		t.Fatalf("%d bytes left over", len(pending))
	}
	return h.got, nil
}

func TestWSReaderFrames(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("b"), 300)
	huge := bytes.Repeat([]byte("h"), 66000)
	var stream []byte
	stream = append(stream, clientFrame(true, OpBinary, []byte("one"))...)
	stream = append(stream, clientFrame(true, OpBinary, nil)...)
	stream = append(stream, clientFrame(false, OpBinary, []byte("fr"))...)
	stream = append(stream, clientFrame(true, OpPing, []byte{1, 2})...) // a ping between fragments
	stream = append(stream, clientFrame(false, OpContinuation, []byte("ag"))...)
	stream = append(stream, clientFrame(true, OpContinuation, []byte("ment"))...)
	stream = append(stream, clientFrame(true, OpText, big)...)
	stream = append(stream, clientFrame(true, OpBinary, huge)...)
	stream = append(stream, clientFrame(true, OpClose, []byte{0x03, 0xe8, 'b', 'y', 'e'})...)
	want := []string{"msg2:one", "msg2:", "ctl9:0102", "msg2:fragment", "msg1:" + string(big),
		"msg2:" + string(huge), "ctl8:03e8627965"}
	// Pieces of one byte try every split point; feeding the 66 kB frame that way takes
	// seconds, so under -short (`make test`) the smallest pieces are of three bytes.
	chunks := []int{1, 3, 14, 100, 4096, len(stream)}
	if testing.Short() {
		chunks = chunks[1:]
	}
	for _, chunk := range chunks {
		got, err := feed(t, append([]byte(nil), stream...), chunk)
		if err != nil {
			t.Fatalf("chunk %d: %v", chunk, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("chunk %d: got %.200q", chunk, got)
		}
	}
}

func TestWSReaderRefuses(t *testing.T) {
	t.Parallel()
	unmasked := clientFrame(true, OpBinary, []byte("x"))
	unmasked[1] &^= 0x80
	rsv := clientFrame(true, OpBinary, []byte("x"))
	rsv[0] |= 0x40
	for name, tc := range map[string]struct {
		stream []byte
		code   uint16
	}{
		"unmasked":            {unmasked, 1002},
		"reserved bit":        {rsv, 1002},
		"unknown opcode":      {clientFrame(true, 0x3, nil), 1002},
		"fragmented ping":     {clientFrame(false, OpPing, nil), 1002},
		"long ping":           {clientFrame(true, OpPing, make([]byte, 126)), 1002},
		"stray continuation":  {clientFrame(true, OpContinuation, []byte("x")), 1002},
		"message in fragment": {append(clientFrame(false, OpBinary, []byte("a")), clientFrame(true, OpBinary, []byte("b"))...), 1002},
		"too big":             {clientFrame(true, OpBinary, make([]byte, 70001)), 1009},
		"too big in pieces": {append(clientFrame(false, OpBinary, make([]byte, 40000)),
			clientFrame(true, OpContinuation, make([]byte, 40000))...), 1009},
		"announced 2^63":   {[]byte{0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0}, 1009},
		"bad close reason": {clientFrame(true, OpClose, []byte{0x03, 0xe8, 0xff}), 1007},
		"text not UTF-8":   {clientFrame(true, OpText, []byte("ok\xed\xa0\x80")), 1007},
		"text not UTF-8 in pieces": {append(clientFrame(false, OpText, []byte("ok\xe2")),
			clientFrame(true, OpContinuation, []byte("\x82"))...), 1007},
	} {
		_, err := feed(t, tc.stream, 5)
		if err == nil || err.Code != tc.code {
			t.Errorf("%s: %v, want code %d", name, err, tc.code)
		}
	}
}

func FuzzWSReader(f *testing.F) {
	f.Add(clientFrame(true, OpBinary, []byte("hello")), 3)
	f.Add(append(clientFrame(false, OpBinary, []byte("a")), clientFrame(true, OpContinuation, []byte("b"))...), 1)
	f.Fuzz(func(t *testing.T, stream []byte, chunk int) {
		if chunk < 1 {
			chunk = 1
		}
		r := Reader{Max: 1024}
		var pending []byte
		for len(stream) > 0 {
			k := min(chunk, len(stream))
			data := append(pending, stream[:k]...)
			stream = stream[k:]
			consumed, _, err := r.Parse(data, &recorder{})
			if err != nil {
				return
			}
			if consumed > len(data) {
				t.Fatalf("consumed %d of %d", consumed, len(data))
			}
			pending = append([]byte(nil), data[consumed:]...)
			if len(r.frag) > r.Max {
				t.Fatalf("fragment of %d bytes kept, max %d", len(r.frag), r.Max)
			}
		}
	})
}

func TestAppendHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		want []byte
	}{
		{0, []byte{0x82, 0}},
		{125, []byte{0x82, 125}},
		{126, []byte{0x82, 126, 0, 126}},
		{65535, []byte{0x82, 126, 0xff, 0xff}},
		{65536, []byte{0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0}},
	} {
		if got := AppendHeader([]byte{0xAA}, OpBinary, tc.n); !bytes.Equal(got, append([]byte{0xAA}, tc.want...)) {
			t.Errorf("%d bytes: header %x, want %x", tc.n, got[1:], tc.want)
		}
	}
}

func TestValidCloseCode(t *testing.T) {
	t.Parallel()
	for code, want := range map[uint16]bool{
		999: false, 1000: true, 1004: false, 1005: false, 1006: false, 1011: true, 1015: false,
		2999: false, 3000: true, 4999: true, 5000: false,
	} {
		if ValidCloseCode(code) != want {
			t.Errorf("ValidCloseCode(%d) = %v, want %v", code, !want, want)
		}
	}
}
