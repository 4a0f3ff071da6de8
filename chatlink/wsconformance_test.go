package chatlink_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"roomcast/chatlink"
	"roomcast/chatlink/internal/wsproto"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// The WebSocket conformance suite: the server cases of the Autobahn testsuite
// (crossbario/autobahn-testsuite), numbered as there, written again for a ChatLink and run
// against a real one over loopback by a raw TCP client that writes hand-built, masked frames.
// Each case says what the client does and what RFC 6455 asks of the server, or where we
// deviate from it, what docs/protocol.md says instead.
//
// Autobahn's server asserts on echoes; a ChatLink echoes nothing. The echo here is a
// HeartbeatAck: a "message" is a binary Heartbeat frame padded with an unknown protobuf field
// to the size the case names, sent after a login, and answered with a HeartbeatAck carrying
// the message's number. Text messages, which Autobahn uses for most cases, are refused by a
// ChatLink (6.x), so the cases that check framing send binary messages instead.

// wsConfCase is one conformance case.
type wsConfCase struct {
	id     string   // the Autobahn case number
	client string   // what the client does
	rfc    string   // what the server must do: RFC 6455, or our documented deviation
	login  bool     // log in before the case's writes
	writes []write  // what the client sends, in order
	want   []string // the events the server must produce, in order of the list (see wsConfEvents)
	// fails is the close code the server fails the connection with; zero means the
	// connection stays open (checked by a final ping that must be answered). When it
	// fails, answers to the frames before the faulty one may be missing: RFC 6455 lets the
	// server fail first (Autobahn calls that non-strict).
	fails uint16
	// closes lists the codes the server may answer a client's close with (a closing case);
	// then the server must close the TCP connection after its close frame.
	closes []uint16
	// mayDrop lists events that may come before the close of a closing case, or not.
	mayDrop []string
}

// write is bytes the client writes, in pieces of at most chop bytes (0: all at once).
type write struct {
	b    []byte
	chop int
}

// frame builds one client frame: masked, with fin and the reserved bits rsv (0-7) as given.
func frame(fin bool, rsv, op byte, payload []byte) []byte {
	b := wsproto.AppendHeader(nil, op, len(payload))
	b[0] = op | rsv<<4
	if fin {
		b[0] |= 0x80
	}
	b[1] |= 0x80
	mask := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	b = append(b, mask[:]...)
	for i, c := range payload {
		b = append(b, c^mask[i&3])
	}
	return b
}

func msg(op byte, payload []byte) []byte { return frame(true, 0, op, payload) }

// beat is a binary message of exactly size bytes that a logged-in ChatLink answers with
// HeartbeatAck{client_time_ms: id}: a Heartbeat frame padded with an unknown field.
func beat(id int64, size int) []byte {
	b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Heartbeat{Heartbeat: &clientpb.Heartbeat{ClientTimeMs: id}}})
	if err != nil {
		panic(err)
	}
	pad := size - len(b)
	if pad == 0 {
		return b
	}
	const field = 1000 // not a Frame field: kept as unknown
	tag := protowire.SizeTag(field)
	for k := pad - tag - 1; k >= 0 && k >= pad-tag-3; k-- {
		if tag+protowire.SizeBytes(k) == pad {
			b = protowire.AppendTag(b, field, protowire.BytesType)
			return protowire.AppendBytes(b, bytes.Repeat([]byte{'p'}, k))
		}
	}
	panic(fmt.Sprintf("no heartbeat of %d bytes", size))
}

// ack is the event of the HeartbeatAck that answers beat(id, ...).
func ack(id int64) string { return "ack:" + strconv.FormatInt(id, 10) }

func once(frames ...[]byte) write { return write{b: bytes.Join(frames, nil)} }

func chopped(chop int, frames ...[]byte) write { return write{b: bytes.Join(frames, nil), chop: chop} }

// fragments splits payload into binary (or op) fragments of at most size bytes.
func fragments(op byte, payload []byte, size int) []byte {
	var out []byte
	for first := true; first || len(payload) > 0; first = false {
		k := min(size, len(payload))
		fop := byte(wsproto.OpContinuation)
		if first {
			fop = op
		}
		out = append(out, frame(k == len(payload), 0, fop, payload[:k])...)
		payload = payload[k:]
	}
	return out
}

func closeFrame(code uint16, reason string) []byte {
	return msg(wsproto.OpClose, append(binary.BigEndian.AppendUint16(nil, code), reason...))
}

// wsConfCases lists the cases. Sizes of the limits cases (9.x) are scaled to the frame limit,
// 65,536 bytes (Autobahn goes to 16 MiB).
func wsConfCases(max int, readerGoroutines bool) []wsConfCase {
	const (
		opText   = wsproto.OpText
		opBinary = wsproto.OpBinary
		opCont   = wsproto.OpContinuation
		opPing   = wsproto.OpPing
		opPong   = wsproto.OpPong
		opClose  = wsproto.OpClose
	)
	const textRefused = "a text message is refused (docs/protocol.md): Kick 4003, then close 4003"
	payload125 := bytes.Repeat([]byte{0xfe}, 125)
	var cases []wsConfCase

	// 1.1: text messages of every length class. Text is not our protocol.
	for i, n := range []int{0, 125, 126, 127, 128, 65535} {
		cases = append(cases, wsConfCase{
			id: fmt.Sprintf("1.1.%d", i+1), client: fmt.Sprintf("text message of %d bytes", n),
			rfc: textRefused, login: true,
			writes: []write{once(msg(opText, bytes.Repeat([]byte{'*'}, n)))},
			want:   []string{"kick:4003"}, fails: 4003,
		})
	}
	cases = append(cases, wsConfCase{
		id: "1.1.8", client: "text message of 65,535 bytes in 997-byte chops",
		rfc: textRefused, login: true,
		writes: []write{chopped(997, msg(opText, bytes.Repeat([]byte{'*'}, 65535)))},
		want:   []string{"kick:4003"}, fails: 4003,
	})
	// 1.2: binary messages of every length class (7-bit, 16-bit and 64-bit lengths).
	cases = append(cases, wsConfCase{
		id: "1.2.1", client: "binary message of 0 bytes",
		rfc:    "an empty message is not a Frame (docs/protocol.md): Kick 4003, close 4003",
		login:  true,
		writes: []write{once(msg(opBinary, nil))}, want: []string{"kick:4003"}, fails: 4003,
	})
	for i, n := range []int{125, 126, 127, 128, 65535, max} {
		cases = append(cases, wsConfCase{
			id: fmt.Sprintf("1.2.%d", i+2), client: fmt.Sprintf("binary message of %d bytes", n),
			rfc: "the message is received whole: answered", login: true,
			writes: []write{once(msg(opBinary, beat(1, n)))}, want: []string{ack(1)},
		})
	}
	cases = append(cases, wsConfCase{
		id: "1.2.8", client: fmt.Sprintf("binary message of %d bytes in 997-byte chops", max),
		rfc: "the message is received whole: answered", login: true,
		writes: []write{chopped(997, msg(opBinary, beat(1, max)))}, want: []string{ack(1)},
	})

	// 2: pings and pongs (RFC 6455 5.5.2, 5.5.3).
	pongsFor := func(n int) (w []byte, want []string) {
		for i := range n {
			w = append(w, msg(opPing, []byte("ping "+strconv.Itoa(i)))...)
			want = append(want, "pong:ping "+strconv.Itoa(i))
		}
		return w, want
	}
	ten, tenPongs := pongsFor(10)
	cases = append(cases,
		wsConfCase{id: "2.1", client: "ping without payload", rfc: "a pong without payload",
			writes: []write{once(msg(opPing, nil))}, want: []string{"pong:"}},
		wsConfCase{id: "2.2", client: "ping with a small text payload", rfc: "a pong with the same payload",
			writes: []write{once(msg(opPing, []byte("Hello, world!")))}, want: []string{"pong:Hello, world!"}},
		wsConfCase{id: "2.3", client: "ping with a small binary payload", rfc: "a pong with the same payload",
			writes: []write{once(msg(opPing, []byte{0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0, 0xff}))},
			want:   []string{"pong:\x00\xff\xfe\xfd\xfc\xfb\x00\xff"}},
		wsConfCase{id: "2.4", client: "ping with a 125-byte payload", rfc: "a pong with the same payload",
			writes: []write{once(msg(opPing, payload125))}, want: []string{"pong:" + string(payload125)}},
		wsConfCase{id: "2.5", client: "ping with a 126-byte payload",
			rfc:    "control frames carry at most 125 bytes (5.5): fail with 1002",
			writes: []write{once(msg(opPing, bytes.Repeat([]byte{0xfe}, 126)))}, fails: 1002},
		wsConfCase{id: "2.6", client: "ping with a 125-byte payload in 1-byte chops", rfc: "a pong with the same payload",
			writes: []write{chopped(1, msg(opPing, payload125))}, want: []string{"pong:" + string(payload125)}},
		wsConfCase{id: "2.7", client: "unsolicited pong without payload", rfc: "nothing: an unsolicited pong is ignored (5.5.3)",
			writes: []write{once(msg(opPong, nil))}},
		wsConfCase{id: "2.8", client: "unsolicited pong with payload", rfc: "nothing",
			writes: []write{once(msg(opPong, []byte("unsolicited")))}},
		wsConfCase{id: "2.9", client: "unsolicited pong, then a ping", rfc: "a pong for the ping only",
			writes: []write{once(msg(opPong, []byte("unsolicited")), msg(opPing, []byte("solicited")))},
			want:   []string{"pong:solicited"}},
		wsConfCase{id: "2.10", client: "10 pings", rfc: "10 pongs, each with its ping's payload",
			writes: []write{once(ten)}, want: tenPongs},
		wsConfCase{id: "2.11", client: "10 pings in 1-byte chops", rfc: "10 pongs",
			writes: []write{chopped(1, ten)}, want: tenPongs},
	)

	// 3: reserved bits, with no extension negotiated (5.2): fail with 1002.
	const rsvFails = "no extension was negotiated, so a reserved bit set fails the connection with 1002 (5.2)"
	cases = append(cases,
		wsConfCase{id: "3.1", client: "binary message with RSV1", rfc: rsvFails, login: true,
			writes: []write{once(frame(true, 4, opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "3.2", client: "a message, one with RSV2, a ping", rfc: rsvFails + "; the first may be answered",
			login:  true,
			writes: []write{once(msg(opBinary, beat(1, 20)), frame(true, 2, opBinary, beat(2, 20)), msg(opPing, nil))},
			want:   []string{ack(1)}, fails: 1002},
		wsConfCase{id: "3.3", client: "as 3.2 with RSV1|RSV2, frame by frame", rfc: rsvFails, login: true,
			writes: []write{once(msg(opBinary, beat(1, 20))), once(frame(true, 6, opBinary, beat(2, 20))), once(msg(opPing, nil))},
			want:   []string{ack(1)}, fails: 1002},
		wsConfCase{id: "3.4", client: "as 3.2 with RSV3, in 1-byte chops", rfc: rsvFails, login: true,
			writes: []write{chopped(1, msg(opBinary, beat(1, 20)), frame(true, 1, opBinary, beat(2, 20)), msg(opPing, nil))},
			want:   []string{ack(1)}, fails: 1002},
		wsConfCase{id: "3.5", client: "binary message with RSV1|RSV3", rfc: rsvFails, login: true,
			writes: []write{once(frame(true, 5, opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "3.6", client: "ping with RSV2|RSV3", rfc: rsvFails,
			writes: []write{once(frame(true, 3, opPing, []byte("ping")))}, fails: 1002},
		wsConfCase{id: "3.7", client: "close with RSV1|RSV2|RSV3", rfc: rsvFails,
			writes: []write{once(frame(true, 7, opClose, nil))}, fails: 1002},
	)

	// 4: reserved opcodes (5.2), non-control (4.1) and control (4.2): fail with 1002.
	for _, g := range []struct {
		sub, kind string
		ops       []byte
	}{{"4.1", "non-control", []byte{3, 4, 5, 6, 7}}, {"4.2", "control", []byte{11, 12, 13, 14, 15}}} {
		for i, op := range g.ops {
			cases = append(cases, wsConfCase{
				id: fmt.Sprintf("%s.%d", g.sub, i+1), client: fmt.Sprintf("a message, a frame of reserved %s opcode %d, a ping", g.kind, op),
				rfc: "fail with 1002 (5.2); the message may be answered", login: true,
				writes: []write{once(msg(opBinary, beat(1, 20)), msg(op, []byte("reserved")), msg(opPing, nil))},
				want:   []string{ack(1)}, fails: 1002,
			})
		}
	}

	// 5: fragmentation (5.4).
	hb := beat(1, 40)
	a, b := hb[:17], hb[17:]
	frag2 := [][]byte{frame(false, 0, opBinary, a), frame(true, 0, opCont, b)}
	withPing := [][]byte{frame(false, 0, opBinary, a), msg(opPing, []byte("between")), frame(true, 0, opCont, b)}
	const reassembled = "the fragments are one message: answered"
	const stray = "a continuation with no message to continue fails with 1002 (5.4)"
	hb5 := beat(1, 50)
	cases = append(cases,
		wsConfCase{id: "5.1", client: "ping in 2 fragments", rfc: "control frames must not be fragmented (5.5): fail with 1002",
			writes: []write{once(frame(false, 0, opPing, []byte("frag")), frame(true, 0, opCont, []byte("ment")))}, fails: 1002},
		wsConfCase{id: "5.2", client: "pong in 2 fragments", rfc: "fail with 1002 (5.5)",
			writes: []write{once(frame(false, 0, opPong, []byte("frag")), frame(true, 0, opCont, []byte("ment")))}, fails: 1002},
		wsConfCase{id: "5.3", client: "message in 2 fragments", rfc: reassembled, login: true,
			writes: []write{once(frag2...)}, want: []string{ack(1)}},
		wsConfCase{id: "5.4", client: "message in 2 fragments, written frame by frame", rfc: reassembled, login: true,
			writes: []write{once(frag2[0]), once(frag2[1])}, want: []string{ack(1)}},
		wsConfCase{id: "5.5", client: "message in 2 fragments, in 1-byte chops", rfc: reassembled, login: true,
			writes: []write{chopped(1, frag2...)}, want: []string{ack(1)}},
		wsConfCase{id: "5.6", client: "message in 2 fragments with a ping between", rfc: "the pong, then the message answered (5.4: control frames may come between fragments)",
			login: true, writes: []write{once(withPing...)}, want: []string{"pong:between", ack(1)}},
		wsConfCase{id: "5.7", client: "as 5.6, frame by frame", rfc: "the pong, then the message answered", login: true,
			writes: []write{once(withPing[0]), once(withPing[1]), once(withPing[2])}, want: []string{"pong:between", ack(1)}},
		wsConfCase{id: "5.8", client: "as 5.6, in 1-byte chops", rfc: "the pong, then the message answered", login: true,
			writes: []write{chopped(1, withPing...)}, want: []string{"pong:between", ack(1)}},
		wsConfCase{id: "5.9", client: "a final continuation with nothing before it, then a message", rfc: stray, login: true,
			writes: []write{once(frame(true, 0, opCont, []byte("stray")), msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.10", client: "as 5.9 in 1-byte chops", rfc: stray, login: true,
			writes: []write{chopped(1, frame(true, 0, opCont, []byte("stray")), msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.11", client: "as 5.9 frame by frame", rfc: stray, login: true,
			writes: []write{once(frame(true, 0, opCont, []byte("stray"))), once(msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.12", client: "a non-final continuation with nothing before it, then a message", rfc: stray, login: true,
			writes: []write{once(frame(false, 0, opCont, []byte("stray")), msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.13", client: "as 5.12 in 1-byte chops", rfc: stray, login: true,
			writes: []write{chopped(1, frame(false, 0, opCont, []byte("stray")), msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.14", client: "as 5.12 frame by frame", rfc: stray, login: true,
			writes: []write{once(frame(false, 0, opCont, []byte("stray"))), once(msg(opBinary, beat(1, 20)))}, fails: 1002},
		wsConfCase{id: "5.15", client: "a message in 2 fragments, then a continuation, then a new fragmented message's start",
			rfc: stray + "; the first message may be answered", login: true,
			writes: []write{once(frag2[0], frag2[1], frame(false, 0, opCont, []byte("3")), frame(true, 0, opBinary, []byte("4")))},
			want:   []string{ack(1)}, fails: 1002},
		wsConfCase{id: "5.16", client: "a non-final continuation, a message start, a final continuation", rfc: stray, login: true,
			writes: []write{once(frame(false, 0, opCont, []byte("1")), frame(false, 0, opBinary, []byte("2")), frame(true, 0, opCont, []byte("3")))},
			fails:  1002},
		wsConfCase{id: "5.17", client: "a final continuation, a message start, a final continuation", rfc: stray, login: true,
			writes: []write{once(frame(true, 0, opCont, []byte("1")), frame(false, 0, opBinary, []byte("2")), frame(true, 0, opCont, []byte("3")))},
			fails:  1002},
		wsConfCase{id: "5.18", client: "a message start, then a new message instead of its continuation",
			rfc: "a new message inside a fragmented one fails with 1002 (5.4)", login: true,
			writes: []write{once(frame(false, 0, opBinary, a), frame(true, 0, opBinary, b))}, fails: 1002},
		wsConfCase{id: "5.19", client: "a message in 5 fragments, a ping after the 2nd and after the 4th", rfc: "both pongs, then the message answered", login: true,
			writes: []write{once(frame(false, 0, opBinary, hb5[:10]), frame(false, 0, opCont, hb5[10:20]), msg(opPing, []byte("p1")),
				frame(false, 0, opCont, hb5[20:30]), frame(false, 0, opCont, hb5[30:40]), msg(opPing, []byte("p2")), frame(true, 0, opCont, hb5[40:]))},
			want: []string{"pong:p1", "pong:p2", ack(1)}},
		wsConfCase{id: "5.20", client: "as 5.19, frame by frame", rfc: "both pongs, then the message answered", login: true,
			writes: []write{once(frame(false, 0, opBinary, hb5[:10])), once(frame(false, 0, opCont, hb5[10:20])), once(msg(opPing, []byte("p1"))),
				once(frame(false, 0, opCont, hb5[20:30])), once(frame(false, 0, opCont, hb5[30:40])), once(msg(opPing, []byte("p2"))), once(frame(true, 0, opCont, hb5[40:]))},
			want: []string{"pong:p1", "pong:p2", ack(1)}},
	)

	// 6: UTF-8. A ChatLink interprets no text: a text message that is UTF-8 is refused as any
	// text message is (4003); one that is not fails the connection with 1007 (8.1), whole or
	// fragmented, checked once the message is complete.
	valid := []byte("Hello-µ@ßöäüàá-UTF-8!!")
	invalid := []byte("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited")
	const notUTF8 = "a text message that is not UTF-8 fails the connection with 1007 (8.1)"
	cases = append(cases,
		wsConfCase{id: "6.1.1", client: "empty text message", rfc: textRefused,
			writes: []write{once(msg(opText, nil))}, want: []string{"kick:4003"}, fails: 4003},
		wsConfCase{id: "6.2.1", client: "valid UTF-8 text message", rfc: textRefused,
			writes: []write{once(msg(opText, valid))}, want: []string{"kick:4003"}, fails: 4003},
		wsConfCase{id: "6.2.3", client: "valid UTF-8 text message, fragmented inside code points", rfc: textRefused,
			writes: []write{once(fragments(opText, valid, 1))}, want: []string{"kick:4003"}, fails: 4003},
		wsConfCase{id: "6.3.1", client: "invalid UTF-8 text message", rfc: notUTF8,
			writes: []write{once(msg(opText, invalid))}, fails: 1007},
		wsConfCase{id: "6.3.2", client: "invalid UTF-8 text message in 1-byte fragments", rfc: notUTF8,
			writes: []write{once(fragments(opText, invalid, 1))}, fails: 1007},
		wsConfCase{id: "6.4.1", client: "invalid UTF-8 text message in 3 fragments, frame by frame", rfc: notUTF8 + "; failing before the last fragment is allowed, not required",
			writes: []write{once(frame(false, 0, opText, invalid[:12])), once(frame(false, 0, opCont, invalid[12:15])), once(frame(true, 0, opCont, invalid[15:]))},
			fails:  1007},
	)

	// 7: closing (5.5.1, 7.1.5, 7.4).
	closeWith := func(id, client string, codes []uint16, w ...write) wsConfCase {
		return wsConfCase{id: id, client: client, writes: w, closes: codes,
			rfc: "a close frame back (echoing the code, or 1000), then the server closes TCP; nothing after the client's close is read (5.5.1)"}
	}
	normal := []uint16{1000}
	c711 := wsConfCase{id: "7.1.1", client: "a message, then a close", login: true,
		rfc:    "the message answered, then a close frame back and the TCP close",
		writes: []write{once(msg(opBinary, beat(1, 20)), closeFrame(1000, ""))}, want: []string{ack(1)}, closes: normal}
	if readerGoroutines {
		// gws's reader answers a close at once, ahead of the answers still queued: they
		// are dropped (docs/protocol.md).
		c711.rfc = "a close frame back and the TCP close; the answer may be dropped"
		c711.want, c711.mayDrop = nil, []string{ack(1)}
	}
	cases = append(cases, c711,
		closeWith("7.1.2", "two closes", normal, once(closeFrame(1000, ""), closeFrame(1000, ""))),
		closeWith("7.1.3", "a close, then a ping", normal, once(closeFrame(1000, ""), msg(opPing, []byte("late")))),
		closeWith("7.1.4", "a close, then a message", normal, once(closeFrame(1000, ""), msg(opBinary, beat(1, 20)))),
		closeWith("7.1.5", "a message's first fragment, a close, its last fragment", normal,
			once(frag2[0], closeFrame(1000, ""), frag2[1])),
		closeWith("7.3.1", "a close without payload", []uint16{1000, 1005}, once(msg(opClose, nil))),
		wsConfCase{id: "7.3.2", client: "a close with a 1-byte payload", rfc: "a close payload is empty or starts with a 2-byte code (5.5.1): fail with 1002",
			writes: []write{once(msg(opClose, []byte{0x03}))}, fails: 1002},
		closeWith("7.3.3", "a close with code 1000", normal, once(closeFrame(1000, ""))),
		closeWith("7.3.4", "a close with code 1000 and a reason", normal, once(closeFrame(1000, "Hello World!"))),
		closeWith("7.3.5", "a close with code 1000 and a 123-byte reason", normal, once(closeFrame(1000, strings.Repeat("*", 123)))),
		wsConfCase{id: "7.3.6", client: "a close with a 124-byte reason (126 bytes of payload)", rfc: "control frames carry at most 125 bytes (5.5): fail with 1002",
			writes: []write{once(closeFrame(1000, strings.Repeat("*", 124)))}, fails: 1002},
		wsConfCase{id: "7.5.1", client: "a close whose reason is not UTF-8", rfc: "a close reason is UTF-8 (5.5.1): fail with 1007",
			writes: []write{once(closeFrame(1000, string(invalid)))}, fails: 1007},
	)
	for i, code := range []uint16{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999} {
		cases = append(cases, closeWith(fmt.Sprintf("7.7.%d", i+1), fmt.Sprintf("a close with valid code %d", code),
			[]uint16{1000, code}, once(closeFrame(code, ""))))
	}
	for i, code := range []uint16{0, 999, 1004, 1005, 1006, 1016, 1100, 2000, 2999} {
		cases = append(cases, wsConfCase{id: fmt.Sprintf("7.9.%d", i+1), client: fmt.Sprintf("a close with invalid code %d", code),
			rfc:    "a code a peer must not send (7.4.1, 7.4.2): fail with 1002",
			writes: []write{once(closeFrame(code, ""))}, fails: 1002})
	}
	cases = append(cases,
		wsConfCase{id: "7.13.1", client: "a close with code 5000", rfc: "outside every range of 7.4.2: fail with 1002",
			writes: []write{once(closeFrame(5000, ""))}, fails: 1002},
		wsConfCase{id: "7.13.2", client: "a close with code 65535", rfc: "outside every range of 7.4.2: fail with 1002",
			writes: []write{once(closeFrame(65535, ""))}, fails: 1002},
	)

	// 9: limits, scaled to the frame limit (max bytes a message).
	const tooBig = "a message over the frame limit fails with 1009 (7.4.1), however it is framed (docs/protocol.md)"
	for i, n := range []int{max / 4, max / 2, max} {
		cases = append(cases, wsConfCase{id: fmt.Sprintf("9.2.%d", i+1), client: fmt.Sprintf("binary message of %d bytes", n),
			rfc: "answered", login: true, writes: []write{once(msg(opBinary, beat(int64(n), n)))}, want: []string{ack(int64(n))}})
	}
	cases = append(cases,
		wsConfCase{id: "9.2.x+", client: fmt.Sprintf("binary message of %d bytes", max+1), rfc: tooBig, login: true,
			writes: []write{once(msg(opBinary, beat(1, max+1)))}, fails: 1009},
		wsConfCase{id: "9.2.x+h", client: "only the header of a binary message announcing 2^63-1 bytes", rfc: tooBig + ", before its payload",
			login: true, writes: []write{once([]byte{0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4})}, fails: 1009},
		wsConfCase{id: "9.1.x", client: fmt.Sprintf("text message of %d bytes", max), rfc: textRefused, login: true,
			writes: []write{once(msg(opText, bytes.Repeat([]byte{'*'}, max)))}, want: []string{"kick:4003"}, fails: 4003},
	)
	for i, size := range []int{64, 256, 1 << 10, 4 << 10, 16 << 10, max} {
		cases = append(cases, wsConfCase{id: fmt.Sprintf("9.4.%d", i+1),
			client: fmt.Sprintf("binary message of %d bytes in fragments of %d", max, size),
			rfc:    "answered", login: true,
			writes: []write{once(fragments(opBinary, beat(int64(size), max), size))}, want: []string{ack(int64(size))}})
	}
	cases = append(cases, wsConfCase{id: "9.4.x+", client: fmt.Sprintf("binary message of %d bytes in fragments of 4096", max+1),
		rfc: tooBig, login: true, writes: []write{once(fragments(opBinary, beat(1, max+1), 4<<10))}, fails: 1009})
	for i, chop := range []int{64, 128, 256, 512, 1 << 10, 2 << 10} {
		cases = append(cases, wsConfCase{id: fmt.Sprintf("9.6.%d", i+1),
			client: fmt.Sprintf("binary message of %d bytes in %d-byte chops", max, chop),
			rfc:    "answered", login: true,
			writes: []write{chopped(chop, msg(opBinary, beat(int64(chop), max)))}, want: []string{ack(int64(chop))}})
	}
	return cases
}

// TestWebSocketConformance runs the conformance cases against a ChatLink that reads with its
// poller (writing with io_uring batches where the kernel allows, or plainly), and one with a
// reader goroutine per connection (gws's reader).
func TestWebSocketConformance(t *testing.T) {
	for _, v := range []struct {
		name             string
		cfg              func(*chatlink.Config)
		readerGoroutines bool
	}{
		{"poller", func(*chatlink.Config) {}, false},
		{"poller plain writes", func(cc *chatlink.Config) { cc.PlainWrites = true }, false},
		{"reader goroutines", func(cc *chatlink.Config) { cc.ReaderGoroutines = true }, true},
	} {
		t.Run(v.name, func(t *testing.T) {
			c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { v.cfg(&cfg.ChatLink) })
			addr := strings.TrimSuffix(strings.TrimPrefix(c.Nodes[0].WSURL(), "ws://"), "/v1/ws")
			for i, tc := range wsConfCases(65536, v.readerGoroutines) {
				t.Run(tc.id, func(t *testing.T) {
					t.Parallel()
					runWSConfCase(t, addr, testcluster.Token(t, "conf"+strconv.Itoa(i), "conf"), tc)
				})
			}
		})
	}
}

// wsConfConn is the client side of a conformance case.
type wsConfConn struct {
	t      *testing.T
	nc     net.Conn
	events chan string
}

func runWSConfCase(t *testing.T, addr, tok string, tc wsConfCase) {
	t.Logf("%s: the client sends %s; RFC 6455: %s", tc.id, tc.client, tc.rfc)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	if _, err := io.WriteString(nc, "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := readUpgradeAnswer(br)
	if err != nil || !strings.HasPrefix(resp, "HTTP/1.1 101 ") {
		t.Fatalf("upgrade answered %q (%v)", resp, err)
	}
	cl := &wsConfConn{t: t, nc: nc, events: make(chan string, 64)}
	go wsConfEvents(br, cl.events)

	if tc.login {
		b, _ := proto.Marshal(loginFrame(tok))
		cl.write(once(msg(wsproto.OpBinary, b)))
		if e := cl.next(); e != "LoginAck" {
			t.Fatalf("login answered with %s", e)
		}
	}
	for _, w := range tc.writes {
		cl.write(w)
	}
	switch {
	case tc.fails != 0:
		// Answers to what came before the faulty frame, then the failing close.
		want := slices.Clone(tc.want)
		for {
			e := cl.next()
			if e == fmt.Sprintf("close:%d", tc.fails) {
				break
			}
			i := slices.Index(want, e)
			if i < 0 {
				t.Fatalf("got %s, want one of %q or close %d", e, want, tc.fails)
			}
			want = slices.Delete(want, i, i+1)
		}
		if i := slices.IndexFunc(tc.want, func(e string) bool { return strings.HasPrefix(e, "kick:") }); i >= 0 {
			// A close of ours is announced by a Kick: that answer is not optional.
			if slices.Contains(want, tc.want[i]) {
				t.Fatalf("closed with %d without a Kick", tc.fails)
			}
		}
		cl.expectEOF()
	case tc.closes != nil:
		cl.expectEvents(tc.want)
		e := cl.next()
		if slices.Contains(tc.mayDrop, e) {
			e = cl.next()
		}
		if !slices.ContainsFunc(tc.closes, func(code uint16) bool { return e == fmt.Sprintf("close:%d", code) }) {
			t.Fatalf("got %s, want a close with one of %v", e, tc.closes)
		}
		cl.expectEOF()
	default:
		// The connection stays open: a last ping is answered, and nothing else came.
		cl.write(once(msg(wsproto.OpPing, []byte("last"))))
		cl.expectEvents(append(slices.Clone(tc.want), "pong:last"))
	}
}

// readUpgradeAnswer reads the server's answer to the upgrade request, up to its blank line,
// and returns its status line.
func readUpgradeAnswer(br *bufio.Reader) (string, error) {
	status, err := br.ReadString('\n')
	for line := status; err == nil && line != "\r\n"; {
		line, err = br.ReadString('\n')
	}
	return strings.TrimSpace(status), err
}

// write sends w, in chops if it says so.
func (cl *wsConfConn) write(w write) {
	cl.t.Helper()
	b, chop := w.b, w.chop
	if chop == 0 {
		chop = len(b)
	}
	for len(b) > 0 {
		k := min(chop, len(b))
		if _, err := cl.nc.Write(b[:k]); err != nil {
			// The server may already have failed the connection, and reset it: what it
			// sent before says whether that was right.
			return
		}
		b = b[k:]
	}
}

// next returns the next event, failing the test if none comes in 5s.
func (cl *wsConfConn) next() string {
	cl.t.Helper()
	select {
	case e := <-cl.events:
		return e
	case <-time.After(5 * time.Second):
		cl.t.Fatal("no event from the server in 5s")
		return ""
	}
}

// expectEvents takes the next len(want) events and checks they are want, in any order: a
// ChatLink writes pongs and messages on different paths, and RFC 6455 orders only the frames
// of one message.
func (cl *wsConfConn) expectEvents(want []string) {
	cl.t.Helper()
	var got []string
	for range want {
		got = append(got, cl.next())
	}
	if !sameEvents(got, want) {
		cl.t.Fatalf("got %q, want %q", got, want)
	}
}

func sameEvents(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// expectEOF checks that the server closes the TCP connection and sends nothing more.
func (cl *wsConfConn) expectEOF() {
	cl.t.Helper()
	if e := cl.next(); e != "eof" {
		cl.t.Fatalf("got %s after the close, want the TCP connection closed", e)
	}
}

// wsConfEvents reads the server's frames and turns each into an event: "pong:PAYLOAD",
// "close:CODE" (1005 for a close without a code), "LoginAck", "ack:ID" (a HeartbeatAck),
// "kick:CODE", another frame's kind, "bad:WHY" for a frame a server must not send, and "eof"
// when the connection ends.
func wsConfEvents(br *bufio.Reader, events chan<- string) {
	defer close(events)
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			events <- "eof"
			return
		}
		if hdr[0]&0x70 != 0 || hdr[0]&0x80 == 0 || hdr[1]&0x80 != 0 {
			events <- fmt.Sprintf("bad:header %x (server frames: FIN, no reserved bits, unmasked)", hdr)
			return
		}
		n := uint64(hdr[1] & 0x7f)
		switch n {
		case 126:
			var ext [2]byte
			_, _ = io.ReadFull(br, ext[:])
			n = uint64(binary.BigEndian.Uint16(ext[:]))
		case 127:
			var ext [8]byte
			_, _ = io.ReadFull(br, ext[:])
			n = binary.BigEndian.Uint64(ext[:])
		}
		if n > 1<<20 {
			events <- fmt.Sprintf("bad:frame of %d bytes", n)
			return
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(br, p); err != nil {
			events <- "eof"
			return
		}
		switch op := hdr[0] & 0x0f; op {
		case wsproto.OpPong:
			events <- "pong:" + string(p)
		case wsproto.OpClose:
			code := uint16(1005)
			if len(p) >= 2 {
				code = binary.BigEndian.Uint16(p)
			}
			events <- fmt.Sprintf("close:%d", code)
		case wsproto.OpBinary:
			var f clientpb.Frame
			if err := proto.Unmarshal(p, &f); err != nil {
				events <- "bad:frame does not parse"
				continue
			}
			switch k := f.Kind.(type) {
			case *clientpb.Frame_HeartbeatAck:
				events <- ack(k.HeartbeatAck.ClientTimeMs)
			case *clientpb.Frame_Kick:
				events <- fmt.Sprintf("kick:%d", k.Kick.Code)
			case *clientpb.Frame_LoginAck:
				events <- "LoginAck"
			default:
				events <- fmt.Sprintf("%T", f.Kind)
			}
		default:
			events <- fmt.Sprintf("bad:opcode %d", op)
		}
	}
}
