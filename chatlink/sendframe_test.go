package chatlink

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// sendFrameCases are frames the direct decoder must read as proto.Unmarshal does, or leave to
// it: Sends of every field, and frames that only look like one.
func sendFrameCases(t testing.TB) [][]byte {
	enc := func(f *clientpb.Frame) []byte {
		b, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	send := func(s *clientpb.Send) []byte { return enc(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: s}}) }
	full := send(&clientpb.Send{Seq: 1<<63 + 5, Type: "chat", Lane: clientpb.Lane_LANE_BULK, Body: []byte("hi there"), TagExpr: `"vip" in tags`})
	cases := [][]byte{
		full,
		send(&clientpb.Send{}),
		send(&clientpb.Send{Seq: 7, Lane: clientpb.Lane(-3)}), // an enum value out of range: kept, as proto3 does
		send(&clientpb.Send{Body: make([]byte, 70000)}),
		enc(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: 1}}}),
		enc(&clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{Seq: 1}}}),
		append(append([]byte{}, full...), full...), // two Sends: proto merges them
		append(append([]byte{}, full...), 0x22, 0), // then a Push
		append(append([]byte{}, full...), 0x00),    // a bad tag after
		full[:len(full)-1],                         // cut short
		nil,
	}
	// A Send whose fields repeat (the last wins), arrive out of order, carry an unknown field or
	// a wrong wire type, or a string that is not UTF-8.
	var s []byte
	s = protowire.AppendTag(s, sendBodyField, protowire.BytesType)
	s = protowire.AppendBytes(s, []byte("b"))
	s = protowire.AppendTag(s, sendSeqField, protowire.VarintType)
	s = protowire.AppendVarint(s, 3)
	s = protowire.AppendTag(s, sendSeqField, protowire.VarintType)
	s = protowire.AppendVarint(s, 4)
	s = protowire.AppendTag(s, sendLaneField, protowire.VarintType)
	s = protowire.AppendVarint(s, 1<<40+2) // wider than an int32: proto keeps the low 32 bits
	wrap := func(inner []byte) []byte {
		b := protowire.AppendTag(nil, frameSendField, protowire.BytesType)
		return protowire.AppendBytes(b, inner)
	}
	cases = append(cases, wrap(s))
	cases = append(cases, wrap(protowire.AppendBytes(protowire.AppendTag(append([]byte{}, s...), 9, protowire.BytesType), []byte("x"))))
	cases = append(cases, wrap(protowire.AppendBytes(protowire.AppendTag(append([]byte{}, s...), sendSeqField, protowire.BytesType), []byte("x"))))
	cases = append(cases, wrap(protowire.AppendVarint(protowire.AppendTag(append([]byte{}, s...), sendTypeField, protowire.VarintType), 1)))
	cases = append(cases, wrap(protowire.AppendBytes(protowire.AppendTag(append([]byte{}, s...), sendTypeField, protowire.BytesType), []byte{0xff, 0xfe})))
	cases = append(cases, wrap(protowire.AppendBytes(protowire.AppendTag(append([]byte{}, s...), sendTagExprField, protowire.BytesType), []byte{0xc3})))
	return cases
}

// agree checks that decodeSendFrame reads data as proto.Unmarshal does: when it takes the frame,
// the general decoder reads the same Send from it, with nothing left unknown.
func agree(t testing.TB, data []byte) {
	got, ok := decodeSendFrame(data)
	var f clientpb.Frame
	err := proto.Unmarshal(data, &f)
	if !ok {
		return // left to proto.Unmarshal, which reads every frame
	}
	if err != nil {
		t.Fatalf("decoded % x directly, proto.Unmarshal refuses it: %v", data, err)
	}
	want := f.GetSend()
	if want == nil {
		t.Fatalf("decoded % x directly as a Send, proto.Unmarshal reads %T", data, f.Kind)
	}
	if len(want.ProtoReflect().GetUnknown()) > 0 || len(f.ProtoReflect().GetUnknown()) > 0 {
		t.Fatalf("decoded % x directly, though it has fields a Send does not", data)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded % x as %v, proto.Unmarshal reads %v", data, got, want)
	}
}

// TestDecodeSendFrameAgrees holds the direct decoder of Send frames to proto.Unmarshal's reading
// of the same bytes: the cases above, and random changes to them. The plain Sends must be taken
// directly (the point of it); the others may be left to proto.Unmarshal.
func TestDecodeSendFrameAgrees(t *testing.T) {
	cases := sendFrameCases(t)
	for _, c := range cases[:4] {
		if _, ok := decodeSendFrame(c); !ok {
			t.Errorf("plain Send % x not decoded directly", c)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		agree(t, c)
		if len(c) == 0 || len(c) > 1000 {
			continue
		}
		for range 2000 {
			m := append([]byte{}, c...)
			for range 1 + r.IntN(3) {
				switch i := r.IntN(len(m)); r.IntN(3) {
				case 0:
					m[i] = byte(r.Uint32())
				case 1:
					m = m[:i]
				default:
					m = append(m[:i], append([]byte{byte(r.Uint32())}, m[i:]...)...)
				}
				if len(m) == 0 {
					break
				}
			}
			agree(t, m)
		}
	}
	// The body is the Send's own: the reader's buffer is used again.
	data := cases[0]
	s, _ := decodeSendFrame(data)
	clear(data)
	if string(s.Body) != "hi there" {
		t.Errorf("body %q after the buffer was cleared", s.Body)
	}
}

// FuzzDecodeSendFrame holds the direct decoder to proto.Unmarshal on any bytes.
func FuzzDecodeSendFrame(f *testing.F) {
	for _, c := range sendFrameCases(f) {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree(t, data) })
}

// BenchmarkDecodeSendFrame compares reading a member's danmaku frame directly with the general
// decoder. cpu-ns/op is the process's CPU per frame.
func BenchmarkDecodeSendFrame(b *testing.B) {
	data, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Send{Send: &clientpb.Send{
		Seq: 12345, Type: "danmaku", Lane: clientpb.Lane_LANE_BULK, Body: make([]byte, 64),
	}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeSendFrame(data); !ok {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f clientpb.Frame
			if err := proto.Unmarshal(data, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
