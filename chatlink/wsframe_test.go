package chatlink

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

func (r *recorder) message(op byte, p []byte) { r.got = append(r.got, fmt.Sprintf("msg%d:%s", op, p)) }
func (r *recorder) control(op byte, p []byte) { r.got = append(r.got, fmt.Sprintf("ctl%d:%x", op, p)) }

// feed parses stream the way wsPolled does, handing it over in pieces of at most chunk bytes
// and keeping what is incomplete.
func feed(t *testing.T, stream []byte, chunk int) ([]string, *wsError) {
	t.Helper()
	r := wsReader{max: 70000}
	h := &recorder{}
	var pending []byte
	for len(stream) > 0 {
		k := min(chunk, len(stream))
		data := append(pending, stream[:k]...)
		stream = stream[k:]
		consumed, need, err := r.parse(data, h)
		if err != nil {
			return h.got, err
		}
		pending = append([]byte(nil), data[consumed:]...)
		if len(pending) > 0 && need < len(pending) && need != wsMaxHeader {
			t.Fatalf("need %d for %d pending bytes", need, len(pending))
		}
	}
	if len(pending) > 0 {
		t.Fatalf("%d bytes left over", len(pending))
	}
	return h.got, nil
}

func TestWSReaderFrames(t *testing.T) {
	big := bytes.Repeat([]byte("b"), 300)
	huge := bytes.Repeat([]byte("h"), 66000)
	var stream []byte
	stream = append(stream, clientFrame(true, wsBinary, []byte("one"))...)
	stream = append(stream, clientFrame(true, wsBinary, nil)...)
	stream = append(stream, clientFrame(false, wsBinary, []byte("fr"))...)
	stream = append(stream, clientFrame(true, wsPing, []byte{1, 2})...) // a ping between fragments
	stream = append(stream, clientFrame(false, wsContinuation, []byte("ag"))...)
	stream = append(stream, clientFrame(true, wsContinuation, []byte("ment"))...)
	stream = append(stream, clientFrame(true, wsText, big)...)
	stream = append(stream, clientFrame(true, wsBinary, huge)...)
	stream = append(stream, clientFrame(true, wsClose, []byte{0x03, 0xe8, 'b', 'y', 'e'})...)
	want := []string{"msg2:one", "msg2:", "ctl9:0102", "msg2:fragment", "msg1:" + string(big),
		"msg2:" + string(huge), "ctl8:03e8627965"}
	for _, chunk := range []int{1, 3, 14, 100, 4096, len(stream)} {
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
	unmasked := clientFrame(true, wsBinary, []byte("x"))
	unmasked[1] &^= 0x80
	rsv := clientFrame(true, wsBinary, []byte("x"))
	rsv[0] |= 0x40
	for name, tc := range map[string]struct {
		stream []byte
		code   uint16
	}{
		"unmasked":            {unmasked, 1002},
		"reserved bit":        {rsv, 1002},
		"unknown opcode":      {clientFrame(true, 0x3, nil), 1002},
		"fragmented ping":     {clientFrame(false, wsPing, nil), 1002},
		"long ping":           {clientFrame(true, wsPing, make([]byte, 126)), 1002},
		"stray continuation":  {clientFrame(true, wsContinuation, []byte("x")), 1002},
		"message in fragment": {append(clientFrame(false, wsBinary, []byte("a")), clientFrame(true, wsBinary, []byte("b"))...), 1002},
		"too big":             {clientFrame(true, wsBinary, make([]byte, 70001)), 1009},
		"too big in pieces": {append(clientFrame(false, wsBinary, make([]byte, 40000)),
			clientFrame(true, wsContinuation, make([]byte, 40000))...), 1009},
		"announced 2^63":   {[]byte{0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0}, 1009},
		"bad close reason": {clientFrame(true, wsClose, []byte{0x03, 0xe8, 0xff}), 1007},
	} {
		_, err := feed(t, tc.stream, 5)
		if err == nil || err.code != tc.code {
			t.Errorf("%s: %v, want code %d", name, err, tc.code)
		}
	}
}

func FuzzWSReader(f *testing.F) {
	f.Add(clientFrame(true, wsBinary, []byte("hello")), 3)
	f.Add(append(clientFrame(false, wsBinary, []byte("a")), clientFrame(true, wsContinuation, []byte("b"))...), 1)
	f.Fuzz(func(t *testing.T, stream []byte, chunk int) {
		if chunk < 1 {
			chunk = 1
		}
		r := wsReader{max: 1024}
		var pending []byte
		for len(stream) > 0 {
			k := min(chunk, len(stream))
			data := append(pending, stream[:k]...)
			stream = stream[k:]
			consumed, _, err := r.parse(data, &recorder{})
			if err != nil {
				return
			}
			if consumed > len(data) {
				t.Fatalf("consumed %d of %d", consumed, len(data))
			}
			pending = append([]byte(nil), data[consumed:]...)
			if len(r.frag) > r.max {
				t.Fatalf("fragment of %d bytes kept, max %d", len(r.frag), r.max)
			}
		}
	})
}
