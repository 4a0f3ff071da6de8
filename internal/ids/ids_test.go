package ids

import (
	"sort"
	"sync"
	"testing"
	"time"
)

func TestIDsSortByTimeAndAreUnique(t *testing.T) {
	var g Generator
	base := time.UnixMilli(1_700_000_000_000)
	var ids []string
	for i := 0; i < 1000; i++ {
		ids = append(ids, g.New(base.Add(time.Duration(i/10)*time.Millisecond)))
	}
	// The clock going back must not break the order.
	ids = append(ids, g.New(base))
	if !sort.StringsAreSorted(ids) {
		t.Fatal("ids are not in order")
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if len(id) != 26 || seen[id] {
			t.Fatalf("id %q: length %d, seen before %v", id, len(id), seen[id])
		}
		seen[id] = true
	}
	// The time part reads back: the first 10 characters are the milliseconds in base32.
	var ms uint64
	for _, ch := range ids[0][:10] {
		ms = ms<<5 | uint64(indexOf(byte(ch)))
	}
	if ms != uint64(base.UnixMilli()) {
		t.Fatalf("time part %d, want %d", ms, base.UnixMilli())
	}
}

func indexOf(c byte) int {
	for i := range crockford {
		if crockford[i] == c {
			return i
		}
	}
	return -1
}

func TestIDsConcurrent(t *testing.T) {
	var g Generator
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				id := g.New(time.Now())
				mu.Lock()
				if seen[id] {
					t.Errorf("duplicate id %s", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func TestSessionNode(t *testing.T) {
	s := SessionID("cl-12", 35)
	if s != "cl-12-z" {
		t.Fatalf("SessionID = %q", s)
	}
	if n, ok := SessionNode(s); !ok || n != "cl-12" {
		t.Fatalf("SessionNode(%q) = %q, %v", s, n, ok)
	}
	if _, ok := SessionNode("nodash"); ok {
		t.Fatal("SessionNode accepted an id without a node")
	}
}

func TestMessageTime(t *testing.T) {
	var g Generator
	now := time.UnixMilli(1764451200123)
	got, ok := MessageTime(g.New(now))
	if !ok || !got.Equal(now) {
		t.Fatalf("MessageTime of a new id = %v, %v; want %v", got, ok, now)
	}
	for _, bad := range []string{"", "01KB", "01KBZZZZZZZZZZZZZZZZZZZZZZ0", "8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "01kbzzzzzzzzzzzzzzzzzzzzzz", "01KBZZZZZZZZZZZZZZZZZZZZZU"} {
		if _, ok := MessageTime(bad); ok {
			t.Errorf("MessageTime(%q) accepted", bad)
		}
	}
}
