// Package ids makes the identifiers Roomcast hands out: message ids that sort by time and are
// unique across every process of a deployment, and session ids that name their node.
package ids

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"time"
)

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// Generator makes message ids: 48 bits of milliseconds then 80 bits that start random each
// millisecond and count up within it, written as 26 characters of Crockford base32 (a ULID).
// Ids from one Generator are strictly increasing; ids from different processes collide only if
// their random parts do (2^-80). The zero value is ready to use.
type Generator struct {
	mu     sync.Mutex // guards the fields below
	lastMS uint64
	hi     uint16 // top 16 of the 80 random bits
	lo     uint64 // bottom 64
}

// New returns a new id for the time now.
func (g *Generator) New(now time.Time) string {
	ms := uint64(now.UnixMilli())
	g.mu.Lock()
	if ms <= g.lastMS {
		// Same millisecond, or the clock went back: keep order by counting up from the last id.
		ms = g.lastMS
		g.lo++
		if g.lo == 0 {
			g.hi++
		}
	} else {
		var b [10]byte
		_, _ = rand.Read(b[:])
		g.hi = binary.BigEndian.Uint16(b[:2]) & 0x7fff // leave room to count up
		g.lo = binary.BigEndian.Uint64(b[2:])
		g.lastMS = ms
	}
	hi, lo := g.hi, g.lo
	g.mu.Unlock()
	return encode(ms, hi, lo)
}

func encode(ms uint64, hi uint16, lo uint64) string {
	var out [26]byte
	// 128 bits: ms (48) | hi (16) | lo (64); 26 base32 digits hold 130 bits, the first two are 0.
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | uint64(hi)<<59
		hi = hi>>5 | uint16(ms<<11)
		ms >>= 5
	}
	return string(out[:])
}

// SessionID names a connection: "<node>-<n>". The node part lets any service route to the
// connection's ChatLink without asking presence.
func SessionID(node string, n uint64) string {
	return node + "-" + strconv.FormatUint(n, 36)
}

// SessionNode returns the node part of a session id.
func SessionNode(session string) (string, bool) {
	i := strings.LastIndexByte(session, '-')
	if i <= 0 {
		return "", false
	}
	return session[:i], true
}

// MessageTime returns the time a message id was made at, to the millisecond, and whether id is
// one: 26 characters of Crockford base32 (upper case) whose value fits in 128 bits.
func MessageTime(id string) (time.Time, bool) {
	if len(id) != 26 || id[0] > '7' {
		return time.Time{}, false
	}
	var ms uint64
	for i := range len(id) {
		d := strings.IndexByte(crockford, id[i])
		if d < 0 {
			return time.Time{}, false
		}
		if i < 10 { // the first 10 digits hold 50 bits: the top 2 are 0, then the 48 of ms
			ms = ms<<5 | uint64(d)
		}
	}
	return time.UnixMilli(int64(ms)), true
}
