package sdk

import (
	"context"
	"errors"
	"fmt"

	"roomcast/proto/clientpb"
)

// Counters (docs/protocol.md, "Counters"): a member adds to the room's named counters (a tap of
// a like, a gift) and receives their running totals, never a message per tap.

// ErrBadCounter refuses an AddCounter before anything is sent: a name that is not 1 to 32
// characters of A-Z a-z 0-9 _ - : . The server refuses an amount over its limit (100 by
// default) with a CounterRefusedEvent.
var ErrBadCounter = errors.New("roomcast: bad counter name (1 to 32 characters of A-Z a-z 0-9 _ - : .)")

// CounterEvent: the room's counters changed (or the client logged in to a room that has some).
// Totals holds every counter of the room by name, a reset one absent; Version grows with every
// change, and the Client hands over only totals newer than the last it handed over.
type CounterEvent struct {
	Totals  map[string]int64
	Version uint64
}

// CounterRefusedEvent: the server refused an AddCounter (Err.Code 120 SEND_RATE_LIMITED with
// Err.RetryAfter, 124 TOO_MANY_COUNTERS, 100 BAD_REQUEST for an amount over the limit); the
// amount was not counted.
type CounterRefusedEvent struct {
	Name   string
	Amount uint32
	Err    *SendError
}

func (*CounterEvent) event()        {}
func (*CounterRefusedEvent) event() {}

// counterRing remembers the last adds sent, so that a refusal (an Error with an add's seq) can
// name its counter.
const counterRing = 256

type sentAdd struct {
	seq    uint64
	name   string
	amount uint32
}

// AddCounter adds amount (0 means 1) to the room's counter name and returns once the add is
// written: the server does not answer an add it counts, and tells of one it refuses with a
// CounterRefusedEvent. The room's totals come as CounterEvents, a few times a second. While the
// Client reconnects, AddCounter waits for the next connection. An add written on a connection
// that then drops may or may not be counted; one written on a connection that stays is counted
// exactly once.
func (c *Client) AddCounter(ctx context.Context, name string, amount uint32) error {
	if !validCounterName(name) {
		return fmt.Errorf("%w: %q", ErrBadCounter, name)
	}
	_, err := onConn(c, ctx, "counter", func(cur *conn) (struct{}, error) { return struct{}{}, cur.addCounter(name, amount) })
	return err
}

// Counters returns the room's counters as the Client last received them (nil before any), and
// their version.
func (c *Client) Counters() (map[string]int64, uint64) {
	return c.d.counterTotals()
}

func validCounterName(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch ch := name[i]; {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9', ch == '_', ch == '-', ch == ':', ch == '.':
		default:
			return false
		}
	}
	return true
}

func (c *conn) addCounter(name string, amount uint32) error {
	seq := c.nextSeq.Add(1)
	c.mu.Lock()
	if c.left {
		c.mu.Unlock()
		return errLeft
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("roomcast: counter: %w", err)
	}
	c.adds[seq%counterRing] = sentAdd{seq: seq, name: name, amount: amount}
	c.mu.Unlock()
	return c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_CounterAdd{CounterAdd: &clientpb.CounterAdd{Seq: seq, Name: name, Amount: amount}}})
}

// refusedAdd hands a refusal of an add to the app; false when seq is not an add's.
func (c *conn) refusedAdd(e *clientpb.Error) bool {
	seq := e.GetSeq()
	c.mu.Lock()
	a := c.adds[seq%counterRing]
	c.mu.Unlock()
	if a.seq != seq || seq == 0 {
		return false
	}
	c.d.event(&CounterRefusedEvent{Name: a.name, Amount: a.amount, Err: sendError(e)})
	return true
}

// counters takes a CounterTotals frame: newer totals than the last are handed to the app.
func (d *delivery) counters(t *clientpb.CounterTotals) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || t.GetVersion() <= d.counterVersion {
		return
	}
	totals := make(map[string]int64, len(t.GetCounters()))
	for _, ct := range t.GetCounters() {
		totals[ct.GetName()] = ct.GetTotal()
	}
	d.counterVersion, d.counterMap = t.GetVersion(), totals
	d.enqueueLocked(item{ev: &CounterEvent{Totals: totals, Version: t.GetVersion()}})
}

func (d *delivery) counterTotals() (map[string]int64, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int64, len(d.counterMap))
	for k, v := range d.counterMap {
		out[k] = v
	}
	if d.counterMap == nil {
		out = nil
	}
	return out, d.counterVersion
}
