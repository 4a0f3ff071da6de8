package mobile

import (
	"context"
	"errors"
	"slices"
	"strings"
)

// Counters are a room's counters (likes, gifts) and their running totals, by name (sorted), as
// an EventCounters carries them.
type Counters struct {
	names   []string
	totals  []int64
	version int64
}

// Len returns how many counters the room has.
func (c *Counters) Len() int { return len(c.names) }

// Name returns the i-th counter's name (0 <= i < Len), in name order.
func (c *Counters) Name(i int) string { return c.names[i] }

// Total returns the i-th counter's running total.
func (c *Counters) Total(i int) int64 { return c.totals[i] }

// Get returns the total of the counter name; 0 when the room has no such counter.
func (c *Counters) Get(name string) int64 {
	if i, ok := slices.BinarySearch(c.names, name); ok {
		return c.totals[i]
	}
	return 0
}

// Version grows with every change of the room's counters.
func (c *Counters) Version() int64 { return c.version }

func newCounters(totals map[string]int64, version uint64) *Counters {
	c := &Counters{version: toInt64(version)}
	for name := range totals {
		c.names = append(c.names, name)
	}
	slices.SortFunc(c.names, strings.Compare)
	for _, name := range c.names {
		c.totals = append(c.totals, totals[name])
	}
	return c
}

// AddCounter adds amount (0 means 1, at most the server's limit, 100 by default) to the room's
// counter name (1 to 32 characters of A-Z a-z 0-9 _ - : .), a tap of a like or a gift, and
// returns once it is written; the server does not answer an add it counts, and tells of one it
// refuses with an EventCounterRefused. Totals come in EventCounters events, a few times a
// second. While the Client reconnects it waits for the next connection, at most
// Config.SendTimeoutMs.
func (c *Client) AddCounter(name string, amount int) error {
	if amount < 0 {
		return errors.New("roomcast: counter: negative amount")
	}
	ctx, cancel := context.WithTimeout(c.ctx, millis(c.cfg.SendTimeoutMs))
	defer cancel()
	return c.c.AddCounter(ctx, name, uint32(min(amount, 1<<31)))
}

// Counters returns the room's counters as last received (empty before any).
func (c *Client) Counters() *Counters {
	totals, version := c.c.Counters()
	return newCounters(totals, version)
}
