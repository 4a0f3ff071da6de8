package auth

import (
	"slices"
	"strings"
)

// decodePlain decodes a claims set of the plain shape every issuer we know writes: one JSON
// object whose member names and string values are printable ASCII without escapes, whose
// values are such strings, arrays of them or numbers, each known member once. It reads it
// without encoding/json, whose Decoder costs a login about ninety allocations.
//
// It reports false for anything outside that shape (an escape, a non-ASCII byte, null, true,
// a nested object, a duplicate, a name that folds to a known one, a date out of range), and
// the caller then decodes with decodeObject, which decides: decodePlain accepts nothing that
// decodeObject refuses and decodes nothing differently (FuzzDecodePlain checks both).
func (w *wireClaims) decodePlain(body []byte) bool {
	s := string(body) // the claims' strings are slices of this one copy
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipSpace(s, i+1) == len(s)
	}
	var seen uint64 // bit k: claimNames[k] was decoded
	for {
		name, j, ok := plainString(s, i)
		if !ok {
			return false
		}
		if i = skipSpace(s, j); i >= len(s) || s[i] != ':' {
			return false
		}
		i = skipSpace(s, i+1)
		k := slices.Index(claimNames, name)
		switch {
		case k >= 0 && seen&(1<<k) != 0:
			return false
		case k >= 0:
			seen |= 1 << k
			i, ok = w.plainMember(k, s, i)
		case foldsToClaim(name):
			return false
		default:
			i, ok = skipPlainValue(s, i)
		}
		if !ok {
			return false
		}
		if i = skipSpace(s, i); i >= len(s) {
			return false
		}
		switch s[i] {
		case '}':
			return skipSpace(s, i+1) == len(s)
		case ',':
			i = skipSpace(s, i+1)
		default:
			return false
		}
	}
}

// plainMember decodes the value at s[i:] into the claim claimNames[k] and returns where it
// ends.
func (w *wireClaims) plainMember(k int, s string, i int) (int, bool) {
	var ok bool
	switch dst := w.targets()[k].(type) {
	case *string:
		*dst, i, ok = plainString(s, i)
	case *[]string:
		*dst, i, ok = plainStrings(s, i)
	case *seconds:
		var lit string
		if lit, i, ok = plainNumber(s, i); ok {
			*dst, ok = parseSeconds(lit)
		}
	}
	return i, ok
}

// foldsToClaim reports whether name matches a claim's name but for case, which decodeObject
// refuses.
func foldsToClaim(name string) bool {
	for _, k := range claimNames {
		if strings.EqualFold(name, k) {
			return true
		}
	}
	return false
}

// skipPlainValue skips an unknown member's value if it is a plain string, a number or an array
// of plain strings.
func skipPlainValue(s string, i int) (int, bool) {
	var ok bool
	switch {
	case i >= len(s):
		return i, false
	case s[i] == '"':
		_, i, ok = plainString(s, i)
	case s[i] == '[':
		_, i, ok = plainStrings(s, i)
	default:
		_, i, ok = plainNumber(s, i)
	}
	return i, ok
}

// plainString reads a JSON string of printable ASCII without escapes at s[i:]: its contents,
// and where it ends.
func plainString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", j, false
		}
	}
	return "", len(s), false
}

// plainStrings reads a JSON array of plain strings at s[i:]. An empty array is an empty,
// non-nil slice, as encoding/json decodes it.
func plainStrings(s string, i int) ([]string, int, bool) {
	if i >= len(s) || s[i] != '[' {
		return nil, i, false
	}
	out := []string{}
	if i = skipSpace(s, i+1); i < len(s) && s[i] == ']' {
		return out, i + 1, true
	}
	for {
		v, j, ok := plainString(s, i)
		if !ok {
			return nil, j, false
		}
		out = append(out, v)
		if i = skipSpace(s, j); i >= len(s) {
			return nil, i, false
		}
		switch s[i] {
		case ']':
			return out, i + 1, true
		case ',':
			i = skipSpace(s, i+1)
		default:
			return nil, i, false
		}
	}
}

// plainNumber reads a JSON number at s[i:] (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?):
// its literal, and where it ends.
func plainNumber(s string, i int) (string, int, bool) {
	start := i
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		return "", i, false
	}
	if i < len(s) && s[i] == '.' {
		if j := skipDigits(s, i+1); j > i+1 {
			i = j
		} else {
			return "", j, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if j := skipDigits(s, i); j > i {
			i = j
		} else {
			return "", j, false
		}
	}
	// A number ends where a delimiter starts; "1x" is not one.
	if i < len(s) && !strings.ContainsRune(" \t\r\n,}]", rune(s[i])) {
		return "", i, false
	}
	return s[start:i], i, true
}

func skipDigits(s string, i int) int {
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return i
}

// skipSpace skips JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
