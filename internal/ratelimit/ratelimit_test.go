package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Limit
		err  bool
	}{
		{"0", Limit{}, false},
		{"20/s", Limit{20, 20}, false},
		{"20/s:50", Limit{20, 50}, false},
		{"60/m", Limit{1, 1}, false},
		{"3600/h:10", Limit{1, 10}, false},
		{"20", Limit{}, true},
		{"20/d", Limit{}, true},
		{"-1/s", Limit{}, true},
		{"20/s:0", Limit{}, true},
		{"20/s:x", Limit{}, true},
	} {
		got, err := Parse(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestTableTripsAtItsRate(t *testing.T) {
	t.Parallel()
	tb := NewTable[string](100)
	l := Limit{Rate: 10, Burst: 5}
	now := time.Unix(1000, 0)
	for i := range 5 {
		if ok, _ := tb.Take("a", l, now); !ok {
			t.Fatalf("take %d of a burst of 5 refused", i+1)
		}
	}
	ok, retry := tb.Take("a", l, now)
	if ok || retry != 100*time.Millisecond {
		t.Fatalf("sixth take: ok %v, retry %v; want refused, retry 100ms", ok, retry)
	}
	if ok, _ := tb.Take("b", l, now); !ok {
		t.Fatal("another key is held by a's bucket")
	}
	// A refused take spends nothing: after the hinted wait, one token is there.
	if ok, _ := tb.Take("a", l, now.Add(retry)); !ok {
		t.Fatal("refused after the retry hint")
	}
	// A live change applies to a key already kept.
	now = now.Add(10 * time.Second)
	tight := Limit{Rate: 1, Burst: 1}
	if ok, _ := tb.Take("a", tight, now); !ok {
		t.Fatal("first take under the tighter limit refused")
	}
	if ok, retry := tb.Take("a", tight, now); ok || retry != time.Second {
		t.Fatalf("second take under 1/s:1: ok %v, retry %v", ok, retry)
	}
	if ok, _ := tb.Take("a", Limit{}, now); !ok {
		t.Fatal("an off limit refused")
	}
}

func TestTableIsBounded(t *testing.T) {
	t.Parallel()
	tb := NewTable[string](64)
	l := Limit{Rate: 1, Burst: 1}
	now := time.Unix(1000, 0)
	for i := range 10000 {
		tb.Take(fmt.Sprint(i), l, now) // every key busy: none can be forgotten for free
	}
	if n := tb.Len(); n > 64 {
		t.Fatalf("table holds %d keys, over its 64", n)
	}
	if tb.Evicted() == 0 {
		t.Fatal("no eviction counted")
	}
	// Keys whose bucket refilled are forgotten first, without counting as evictions.
	ev := tb.Evicted()
	later := now.Add(time.Hour)
	for i := range 64 {
		tb.Take(fmt.Sprint("x", i), l, later)
	}
	if tb.Evicted() != ev {
		t.Fatalf("evicted %d busy keys while idle ones could go", tb.Evicted()-ev)
	}
}

func BenchmarkTableTake(b *testing.B) {
	tb := NewTable[string](1 << 16)
	l := Limit{Rate: 1e6, Burst: 1e6}
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tb.Take("room", l, now)
	}
}
