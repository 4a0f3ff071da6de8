package chatlink

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// connTable holds every open connection of a node, sharded to keep accept and close from
// contending.
type connTable struct {
	seed   maphash.Seed
	count  atomic.Int64
	shards [64]struct {
		mu    sync.Mutex // guards conns
		conns map[*conn]struct{}
	}
}

func newConnTable() *connTable {
	t := &connTable{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].conns = make(map[*conn]struct{})
	}
	return t
}

func (t *connTable) shardOf(c *conn) int { return int(maphash.Comparable(t.seed, c) % 64) }

func (t *connTable) add(c *conn) {
	sh := &t.shards[t.shardOf(c)]
	sh.mu.Lock()
	sh.conns[c] = struct{}{}
	sh.mu.Unlock()
	t.count.Add(1)
}

func (t *connTable) remove(c *conn) {
	sh := &t.shards[t.shardOf(c)]
	sh.mu.Lock()
	if _, ok := sh.conns[c]; ok {
		delete(sh.conns, c)
		t.count.Add(-1)
	}
	sh.mu.Unlock()
}

func (t *connTable) len() int { return int(t.count.Load()) }

// each calls f for every connection; f runs without the table's locks held.
func (t *connTable) each(f func(*conn)) {
	var batch []*conn
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		batch = batch[:0]
		for c := range sh.conns {
			batch = append(batch, c)
		}
		sh.mu.Unlock()
		for _, c := range batch {
			f(c)
		}
	}
}
