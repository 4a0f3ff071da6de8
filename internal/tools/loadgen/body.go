package loadgen

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
)

// A bench message body: a magic, the run id, a sequence number and the send time, padded
// with 'x' to the configured size. It is binary (sent as body_base64) so that thousands of
// receivers read it without parsing text.
//
//	0..4   "rcb1"
//	4..8   run id
//	8..16  sequence number, big-endian
//	16..24 send time, unix nanoseconds, big-endian
const (
	bodyMagic   = "rcb1"
	bodyHeader  = 24
	defaultSize = 64
)

type runID [4]byte

func appendBody(b []byte, run runID, seq uint64, sentUnixNano int64, size int) []byte {
	b = append(b, bodyMagic...)
	b = append(b, run[:]...)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint64(b, uint64(sentUnixNano))
	for len(b) < size {
		b = append(b, 'x')
	}
	return b
}

// parseBody reads a bench body of run; ok is false for anything else (other traffic in the
// room).
func parseBody(b []byte, run runID) (seq uint64, sentUnixNano int64, ok bool) {
	if len(b) < bodyHeader || string(b[:4]) != bodyMagic || !bytes.Equal(b[4:8], run[:]) {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(b[8:16]), int64(binary.BigEndian.Uint64(b[16:24])), true
}

// randomText fills b with random lowercase letters and spaces: about as compressible as chat.
func randomText(b []byte) {
	const letters = "abcdefghijklmnopqrstuvwxyz     "
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
}
