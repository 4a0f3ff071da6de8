// Package wsproto is the server side of the WebSocket wire format (RFC 6455) for the
// ChatLink's own I/O engine: a parser of the frames clients send, the header of the frames the
// server sends, and a parser of the HTTP upgrade request that keeps only what the handshake
// needs.
//
// It knows frames and opcodes, not what a frame means: it never decodes a payload, holds no
// connection and makes no system call. Answering the handshake is gws's job; what a message
// says is the chatlink package's.
package wsproto

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// WebSocket opcodes (RFC 6455 section 5.2).
const (
	OpContinuation = 0x0
	OpText         = 0x1
	OpBinary       = 0x2
	OpClose        = 0x8
	OpPing         = 0x9
	OpPong         = 0xA
)

// MaxHeader is the longest frame header a client sends: 2 bytes, an 8-byte length and a
// 4-byte mask.
const MaxHeader = 14

// ProtocolError is a reason to end a connection, with the WebSocket close code to send.
type ProtocolError struct {
	Code   uint16 // 1002 protocol error, 1007 bad data, 1009 message too big
	Reason string
}

func (e *ProtocolError) Error() string { return fmt.Sprintf("websocket %d: %s", e.Code, e.Reason) }

// errNotUTF8 fails a connection whose text message is not UTF-8 (RFC 6455 8.1), checked once
// the message is complete.
var errNotUTF8 = &ProtocolError{1007, "text message is not UTF-8"}

// Handler receives what a Reader parses. payload is valid only during the call.
type Handler interface {
	// Message receives a complete (possibly reassembled) binary message, or a text message
	// that is UTF-8.
	Message(op byte, payload []byte)
	// Control receives a ping, pong or close frame.
	Control(op byte, payload []byte)
}

// Reader parses the frames a client sends, as they arrive in pieces from a socket that is
// read when it is readable rather than by a goroutine of its own. It keeps no buffer between
// reads unless a fragmented message is incomplete. The zero value accepts no payload: set Max.
type Reader struct {
	Max      int    // the longest message payload accepted
	frag     []byte // the payload so far of a fragmented message
	fragOp   byte   // its opcode
	fragging bool
}

// Parse hands every complete frame at the start of data to h and returns how many bytes it
// consumed. When the frame after those is incomplete, need is its full length (header and
// payload) if the header is complete, else MaxHeader. Payloads are unmasked in place.
// After a close frame Parse stops, consuming it.
func (r *Reader) Parse(data []byte, h Handler) (consumed, need int, perr *ProtocolError) {
	for {
		rest := data[consumed:]
		if len(rest) < 2 {
			return consumed, MaxHeader, nil
		}
		b0, b1 := rest[0], rest[1]
		fin, op := b0&0x80 != 0, b0&0x0F
		switch {
		case b0&0x70 != 0:
			return consumed, 0, &ProtocolError{1002, "reserved bits set"}
		case b1&0x80 == 0:
			return consumed, 0, &ProtocolError{1002, "client frames must be masked"}
		case op > OpBinary && op < OpClose, op > OpPong:
			return consumed, 0, &ProtocolError{1002, "unknown opcode"}
		}
		hdr, size := 2, uint64(b1&0x7F)
		switch size {
		case 126:
			if len(rest) < 4 {
				return consumed, MaxHeader, nil
			}
			hdr, size = 4, uint64(binary.BigEndian.Uint16(rest[2:]))
		case 127:
			if len(rest) < 10 {
				return consumed, MaxHeader, nil
			}
			hdr, size = 10, binary.BigEndian.Uint64(rest[2:])
		}
		control := op >= OpClose
		switch {
		case control && (!fin || size > 125):
			return consumed, 0, &ProtocolError{1002, "bad control frame"}
		case !control && size > uint64(r.Max-len(r.frag)):
			return consumed, 0, &ProtocolError{1009, "message too big"}
		case op == OpContinuation && !r.fragging:
			return consumed, 0, &ProtocolError{1002, "continuation without a message"}
		case (op == OpText || op == OpBinary) && r.fragging:
			return consumed, 0, &ProtocolError{1002, "new message inside a fragmented one"}
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
			if op == OpClose && len(payload) >= 2 && !utf8.Valid(payload[2:]) {
				return consumed, 0, &ProtocolError{1007, "close reason is not UTF-8"}
			}
			h.Control(op, payload)
			if op == OpClose {
				return consumed, 0, nil
			}
		case op == OpContinuation:
			r.frag = append(r.frag, payload...)
			if fin {
				if r.fragOp == OpText && !utf8.Valid(r.frag) {
					return consumed, 0, errNotUTF8
				}
				h.Message(r.fragOp, r.frag)
				r.frag, r.fragging = nil, false
			}
		case fin:
			if op == OpText && !utf8.Valid(payload) {
				return consumed, 0, errNotUTF8
			}
			h.Message(op, payload)
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

// AppendHeader appends the header of a server frame (unmasked, FIN set) of opcode op with a
// payload of n bytes.
func AppendHeader(dst []byte, op byte, n int) []byte {
	dst = append(dst, 0x80|op)
	switch {
	case n < 126:
		return append(dst, byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, 127), uint64(n))
}

// ValidCloseCode reports whether a peer may send code in a close frame (RFC 6455 7.4).
func ValidCloseCode(code uint16) bool {
	switch {
	case code >= 3000 && code < 5000:
		return true
	case code < 1000 || code > 1014:
		return false
	}
	return code != 1004 && code != 1005 && code != 1006
}
