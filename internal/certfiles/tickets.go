package certfiles

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultTicketRotate is how long one session-ticket key seals new tickets.
const DefaultTicketRotate = 24 * time.Hour

// minTicketSecret is the shortest ticket secret accepted, in bytes.
const minTicketSecret = 32

// ticketKeys seal and open TLS session tickets with keys derived from a secret the servers of
// a deployment share and from the period of TicketRotate the time falls in: every server
// derives the same key for a period without talking to the others, a key seals for one period,
// and a ticket sealed in the period before (or after, for a clock a little ahead) still
// opens. A ticket names its period in its first 8 bytes, which the seal authenticates.
type ticketKeys struct {
	secret []byte
	period time.Duration
	now    func() time.Time

	mu    sync.Mutex            // guards aeads
	aeads map[int64]cipher.AEAD // by period; the three around now at most
}

func newTicketKeys(file string, period time.Duration, now func() time.Time) (*ticketKeys, error) {
	secret, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("certfiles: ticket secret: %w", err)
	}
	if len(secret) < minTicketSecret {
		return nil, fmt.Errorf("certfiles: ticket secret %s: %d bytes, want at least %d", file, len(secret), minTicketSecret)
	}
	return &ticketKeys{secret: secret, period: period, now: now, aeads: map[int64]cipher.AEAD{}}, nil
}

// aead returns the key of period p.
func (k *ticketKeys) aead(p int64) cipher.AEAD {
	k.mu.Lock()
	defer k.mu.Unlock()
	if a, ok := k.aeads[p]; ok {
		return a
	}
	for q := range k.aeads {
		if q < p-1 || q > p+1 {
			delete(k.aeads, q)
		}
	}
	mac := hmac.New(sha256.New, k.secret)
	mac.Write([]byte("roomcast tls session ticket key"))
	mac.Write(binary.BigEndian.AppendUint64(nil, uint64(p)))
	block, err := aes.NewCipher(mac.Sum(nil)) // 32 bytes: AES-256
	if err != nil {
		panic(err) // only a bug gets here: the key has the right size
	}
	a, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	k.aeads[p] = a
	return a
}

func (k *ticketKeys) periodNow() int64 { return k.now().UnixNano() / int64(k.period) }

// wrap seals a session into a ticket (tls.Config.WrapSession).
func (k *ticketKeys) wrap(_ tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
	state, err := ss.Bytes()
	if err != nil {
		return nil, err
	}
	p := k.periodNow()
	a := k.aead(p)
	out := binary.BigEndian.AppendUint64(make([]byte, 0, 8+a.NonceSize()+len(state)+a.Overhead()), uint64(p))
	nonce := out[8 : 8+a.NonceSize()]
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(out[:8+a.NonceSize()], nonce, state, out[:8]), nil
}

// unwrap opens a ticket (tls.Config.UnwrapSession). A ticket that does not open, or whose
// period is too old, is ignored (nil, nil): the client gets a full handshake.
func (k *ticketKeys) unwrap(ticket []byte, _ tls.ConnectionState) (*tls.SessionState, error) {
	if len(ticket) < 8 {
		return nil, nil
	}
	p := int64(binary.BigEndian.Uint64(ticket))
	if now := k.periodNow(); p < now-1 || p > now+1 {
		return nil, nil
	}
	a := k.aead(p)
	if len(ticket) < 8+a.NonceSize()+a.Overhead() {
		return nil, nil
	}
	state, err := a.Open(nil, ticket[8:8+a.NonceSize()], ticket[8+a.NonceSize():], ticket[:8])
	if err != nil {
		return nil, nil
	}
	ss, err := tls.ParseSessionState(state)
	if err != nil {
		return nil, nil // sealed by a server of another version, say: ignored too
	}
	return ss, nil
}
