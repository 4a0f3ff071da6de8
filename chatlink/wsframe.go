package chatlink

import (
	"encoding/binary"
	"unicode/utf8"
)

// WebSocket opcodes (RFC 6455 section 5.2).
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
	wsPing         = 0x9
	wsPong         = 0xA
)

// wsMaxHeader is the longest frame header a client sends: 2 bytes, an 8-byte length and a
// 4-byte mask.
const wsMaxHeader = 14

// wsError is a reason to end a connection, with the WebSocket close code to send.
type wsError struct {
	code   uint16 // 1002 protocol error, 1009 message too big
	reason string
}

// wsFrameHandler receives what wsReader parses. payload is valid only during the call.
type wsFrameHandler interface {
	// message receives a complete (possibly reassembled) text or binary message.
	message(op byte, payload []byte)
	// control receives a ping, pong or close frame.
	control(op byte, payload []byte)
}

// wsReader parses the frames a client sends, for the connections that are read by the
// node's poller instead of by a goroutine of their own (poll_linux.go). It keeps no buffer
// between reads unless a frame or a fragmented message is incomplete.
type wsReader struct {
	max      int    // the longest message payload accepted
	frag     []byte // the payload so far of a fragmented message
	fragOp   byte   // its opcode
	fragging bool
}

// parse hands every complete frame at the start of data to h and returns how many bytes it
// consumed. When the frame after those is incomplete, need is its full length (header and
// payload) if the header is complete, else wsMaxHeader. Payloads are unmasked in place.
// After a close frame parse stops, consuming it.
func (r *wsReader) parse(data []byte, h wsFrameHandler) (consumed, need int, werr *wsError) {
	for {
		rest := data[consumed:]
		if len(rest) < 2 {
			return consumed, wsMaxHeader, nil
		}
		b0, b1 := rest[0], rest[1]
		fin, op := b0&0x80 != 0, b0&0x0F
		switch {
		case b0&0x70 != 0:
			return consumed, 0, &wsError{1002, "reserved bits set"}
		case b1&0x80 == 0:
			return consumed, 0, &wsError{1002, "client frames must be masked"}
		case op > wsBinary && op < wsClose, op > wsPong:
			return consumed, 0, &wsError{1002, "unknown opcode"}
		}
		hdr, size := 2, uint64(b1&0x7F)
		switch size {
		case 126:
			if len(rest) < 4 {
				return consumed, wsMaxHeader, nil
			}
			hdr, size = 4, uint64(binary.BigEndian.Uint16(rest[2:]))
		case 127:
			if len(rest) < 10 {
				return consumed, wsMaxHeader, nil
			}
			hdr, size = 10, binary.BigEndian.Uint64(rest[2:])
		}
		control := op >= wsClose
		switch {
		case control && (!fin || size > 125):
			return consumed, 0, &wsError{1002, "bad control frame"}
		case !control && size > uint64(r.max-len(r.frag)):
			return consumed, 0, &wsError{1009, "message too big"}
		case op == wsContinuation && !r.fragging:
			return consumed, 0, &wsError{1002, "continuation without a message"}
		case (op == wsText || op == wsBinary) && r.fragging:
			return consumed, 0, &wsError{1002, "new message inside a fragmented one"}
		}
		total := hdr + 4 + int(size)
		if len(rest) < total {
			return consumed, total, nil
		}
		mask := rest[hdr : hdr+4]
		payload := rest[hdr+4 : total]
		unmask(payload, mask)
		consumed += total

		switch {
		case control:
			if op == wsClose && len(payload) >= 2 && !utf8.Valid(payload[2:]) {
				return consumed, 0, &wsError{1007, "close reason is not UTF-8"}
			}
			h.control(op, payload)
			if op == wsClose {
				return consumed, 0, nil
			}
		case op == wsContinuation:
			r.frag = append(r.frag, payload...)
			if fin {
				h.message(r.fragOp, r.frag)
				r.frag, r.fragging = nil, false
			}
		case fin:
			h.message(op, payload)
		default:
			r.frag, r.fragOp, r.fragging = append([]byte(nil), payload...), op, true
		}
	}
}

// unmask XORs payload with the 4-byte mask, eight bytes at a time where it can.
func unmask(payload, mask []byte) {
	m4 := binary.LittleEndian.Uint32(mask)
	m8 := uint64(m4)<<32 | uint64(m4)
	i := 0
	for ; i+8 <= len(payload); i += 8 {
		binary.LittleEndian.PutUint64(payload[i:], binary.LittleEndian.Uint64(payload[i:])^m8)
	}
	for ; i < len(payload); i++ {
		payload[i] ^= mask[i&3]
	}
}
