package testkit

import (
	"encoding/binary"
	"io"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// ReadFrame reads one frame of the TCP transport from r: a 4-byte big-endian length, then that
// many bytes of Frame. A fake server reads its client's frames with it.
func ReadFrame(r io.Reader) (*clientpb.Frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	f := new(clientpb.Frame)
	return f, proto.Unmarshal(b, f)
}

// WriteFrame writes f to w as one frame of the TCP transport, in one write.
func WriteFrame(w io.Writer, f *clientpb.Frame) error {
	b, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	_, err = w.Write(TCPFrame(b))
	return err
}

// TCPFrame returns payload behind the TCP transport's length prefix: one frame on the wire.
func TCPFrame(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(payload)), uint32(len(payload))), payload...)
}
