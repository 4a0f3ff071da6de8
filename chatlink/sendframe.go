package chatlink

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"roomcast/proto/clientpb"
)

// A member's Send is the frame a ChatLink reads most often (a viewer's danmaku), and the
// generic decoder costs it more than the Send's few fields do: a Frame, its oneof wrapper and
// the reflection that fills them. decodeSendFrame reads the plain form of a Frame holding a
// Send directly; anything else (another kind, a field it does not know, a wire type it does
// not expect, a string that is not UTF-8, bytes after the Send) is left to proto.Unmarshal, so
// what a frame means does not depend on which decoder read it (TestDecodeSendFrameAgrees).

// Field numbers of client.proto's Frame.send and of Send's fields.
const (
	frameSendField   = 3
	sendSeqField     = 1
	sendTypeField    = 2
	sendLaneField    = 3
	sendBodyField    = 4
	sendTagExprField = 5
)

// decodeSendFrame decodes data as proto.Unmarshal would a Frame whose kind is a Send, when data
// is one: a length-delimited field 3 to the end of data, holding Send's fields only. ok is false
// for anything else, and the caller decodes data the general way.
func decodeSendFrame(data []byte) (s *clientpb.Send, ok bool) {
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 || num != frameSendField || typ != protowire.BytesType {
		return nil, false
	}
	b, m := protowire.ConsumeBytes(data[n:])
	if m < 0 || n+m != len(data) {
		return nil, false
	}
	s = new(clientpb.Send)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case (num == sendSeqField || num == sendLaneField) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			if num == sendSeqField {
				s.Seq = v
			} else {
				s.Lane = clientpb.Lane(int32(v)) // an int32 on the wire as a 64-bit varint
			}
		case num >= sendTypeField && num <= sendTagExprField && num != sendLaneField && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case sendBodyField:
				s.Body = append([]byte{}, v...) // data is the reader's buffer, used again
			case sendTypeField:
				if !utf8.Valid(v) {
					return nil, false
				}
				s.Type = string(v)
			default:
				if !utf8.Valid(v) {
					return nil, false
				}
				s.TagExpr = string(v)
			}
		default:
			return nil, false
		}
	}
	return s, true
}
