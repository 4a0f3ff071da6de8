package api

import (
	"encoding/base64"
	"strings"
	"unicode/utf8"

	"roomcast/proto/apipb"
)

// The body of POST /v1/rooms/{room}/messages, the API's busiest call, is nearly always a flat
// object of strings ({"type":"chat","lane":"critical","body":"hi","tag_expr":"\"c:3\" in tags"}).
// decodeSendToRoom reads that shape without protojson's reflection; any other body (\u escapes,
// camelCase names, null, numbers, a field twice, an unknown field, a malformed one) is left to
// protojson, which decodes or refuses it as for every other route. What it accepts, protojson
// decodes to the same message (FuzzDecodeSendToRoom).

// decodeSendToRoom fills req from body and reports true when body has the plain shape;
// otherwise it reports false and leaves req as it was.
func decodeSendToRoom(body []byte, req *apipb.SendToRoomRequest) bool {
	d := plainObject{b: body}
	var out apipb.SendToRoomRequest
	var seen [8]bool // by field number
	ok := d.each(func(name, value []byte) bool {
		var field *string
		var num int
		switch string(name) {
		case "type":
			field, num = &out.Type, 2
		case "lane":
			field, num = &out.Lane, 3
		case "body":
			field, num = &out.Body, 4
		case "body_base64":
			num = 5
		case "sender":
			field, num = &out.Sender, 6
		case "tag_expr":
			field, num = &out.TagExpr, 7
		default:
			return false // room (the path names it), a JSON name, an unknown field
		}
		if seen[num] {
			return false
		}
		seen[num] = true
		if field != nil {
			*field = string(value)
			return true
		}
		b, ok := decodeBase64(string(value))
		out.BodyBase64 = b
		return ok
	})
	if !ok {
		return false
	}
	req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender, req.TagExpr = out.Type, out.Lane, out.Body, out.BodyBase64, out.Sender, out.TagExpr
	return true
}

// decodeBase64 decodes a bytes field as protojson does: standard or URL alphabet, padded or not.
func decodeBase64(s string) ([]byte, bool) {
	enc := base64.StdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.URLEncoding
	}
	if len(s)%4 != 0 {
		enc = enc.WithPadding(base64.NoPadding)
	}
	b, err := enc.DecodeString(s)
	return b, err == nil
}

// plainObject reads a JSON object whose members are all strings, with no \u escapes.
type plainObject struct {
	b []byte
	i int
}

// each calls f with each member's name and value, in order, and reports whether the whole
// input was such an object and f accepted every member. name and value point into the input.
func (d *plainObject) each(f func(name, value []byte) bool) bool {
	if !d.skip('{') {
		return false
	}
	if d.skip('}') {
		return d.end()
	}
	for {
		name, ok := d.str()
		if !ok || !d.skip(':') {
			return false
		}
		value, ok := d.str()
		if !ok || !f(name, value) {
			return false
		}
		if d.skip('}') {
			return d.end()
		}
		if !d.skip(',') {
			return false
		}
	}
}

// skip consumes c after any white space and reports whether it was there.
func (d *plainObject) skip(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// str consumes a string without control characters or \u escapes, in valid UTF-8, and
// returns it unescaped. Without escapes it points into the input.
func (d *plainObject) str() ([]byte, bool) {
	if !d.skip('"') {
		return nil, false
	}
	start, ascii := d.i, true
	var out []byte // what came before the last escape, unescaped; nil until the first
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			if out != nil {
				s = append(out, s...)
			}
			d.i++
			// An escape stands for an ASCII byte, so the unescaped string is valid UTF-8 exactly
			// when the input's pieces between escapes are, as protojson checks them.
			return s, ascii || utf8.Valid(s)
		case c == '\\':
			if d.i+1 == len(d.b) {
				return nil, false
			}
			e, ok := unescape(d.b[d.i+1])
			if !ok {
				return nil, false // \u, which protojson reads with its surrogate rules, or no escape
			}
			out = append(append(out, d.b[start:d.i]...), e)
			d.i++
			start = d.i + 1
		case c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// unescape returns the byte a JSON escape other than \u stands for: \" \\ \/ \b \f \n \r \t.
func unescape(c byte) (byte, bool) {
	switch c {
	case '"', '\\', '/':
		return c, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}

func (d *plainObject) space() {
	for d.i < len(d.b) && (d.b[d.i] == ' ' || d.b[d.i] == '\t' || d.b[d.i] == '\n' || d.b[d.i] == '\r') {
		d.i++
	}
}

// end reports whether nothing but white space is left.
func (d *plainObject) end() bool {
	d.space()
	return d.i == len(d.b)
}
