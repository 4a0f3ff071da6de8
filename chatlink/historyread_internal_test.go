package chatlink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"roomcast/proto/clientpb"
)

// fakeHistory is a history whose reads wait until the test lets them end; each read returns
// one message naming it ("read-1", "read-2", ...).
type fakeHistory struct {
	mu      sync.Mutex
	started []historyKey
	release chan struct{} // a read ends when it receives from here
	served  []int
}

func newFakeHistory() (*fakeHistory, *historyReads) {
	f := &fakeHistory{release: make(chan struct{})}
	h := &historyReads{
		fetch: func(k historyKey) (roomHistory, error) {
			f.mu.Lock()
			f.started = append(f.started, k)
			id := fmt.Sprintf("read-%d", len(f.started))
			f.mu.Unlock()
			<-f.release
			if k.room == "broken" {
				return roomHistory{}, errors.New("stream unavailable")
			}
			return roomHistory{msgs: []*clientpb.Message{{Id: id}}}, nil
		},
		spawn: func(fn func()) { go fn() },
		served: func(askers int) {
			f.mu.Lock()
			f.served = append(f.served, askers)
			f.mu.Unlock()
		},
	}
	return f, h
}

func (f *fakeHistory) reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

// waitReads waits until n reads have started.
func (f *fakeHistory) waitReads(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.reads() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads started, want %d", f.reads(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHistoryReadsShared: the recoveries of a room that ask while a read is under way share one
// read, which starts after the one under way ends (never its result: it may have been read
// before they joined the fan-out); rooms are read apart; a failed read fails its askers only.
func TestHistoryReadsShared(t *testing.T) {
	f, h := newFakeHistory()
	stage := historyKey{app: "demo", room: "stage"}
	type result struct {
		id  string
		err error
	}
	ask := func(k historyKey) chan result {
		ch := make(chan result, 1)
		go func() {
			kept, err := h.read(context.Background(), k)
			var id string
			if len(kept.msgs) == 1 {
				id = kept.msgs[0].Id
			}
			ch <- result{id, err}
		}()
		return ch
	}

	first := ask(stage)
	f.waitReads(t, 1)
	// 50 recoveries ask while the first read is under way.
	var later []chan result
	for range 50 {
		later = append(later, ask(stage))
	}
	other := ask(historyKey{app: "demo", room: "class-1"})
	f.waitReads(t, 2) // the other room's read starts at once
	time.Sleep(20 * time.Millisecond)
	if n := f.reads(); n != 2 {
		t.Fatalf("%d reads started while the stage's first was under way, want 2 (the stage's next waits)", n)
	}

	f.release <- struct{}{} // one of the two running reads ends
	f.release <- struct{}{} // and the other
	f.waitReads(t, 3)       // the stage's next read, for the 50
	f.release <- struct{}{}

	if r := <-first; r.err != nil || r.id != "read-1" {
		t.Errorf("the first recovery got %+v, want read-1", r)
	}
	if r := <-other; r.err != nil || r.id != "read-2" {
		t.Errorf("the other room's recovery got %+v, want read-2", r)
	}
	for i, ch := range later {
		if r := <-ch; r.err != nil || r.id != "read-3" {
			t.Fatalf("recovery %d that asked during the first read got %+v, want the next read, read-3", i, r)
		}
	}
	if n := f.reads(); n != 3 {
		t.Errorf("%d reads for 52 recoveries, want 3", n)
	}
	f.mu.Lock()
	served := 0
	for _, n := range f.served {
		served += n
	}
	f.mu.Unlock()
	if served != 52 {
		t.Errorf("reads served %d recoveries, want 52", served)
	}

	// A room with nothing under way is read afresh: no result is kept between reads.
	again := ask(stage)
	f.waitReads(t, 4)
	f.release <- struct{}{}
	if r := <-again; r.id != "read-4" {
		t.Errorf("a later recovery got %+v, want a read of its own, read-4", r)
	}

	// A failed read fails the recoveries that shared it.
	broken := historyKey{app: "demo", room: "broken"}
	b1, b2 := ask(broken), ask(broken) // one reads, the other waits for the next read
	f.waitReads(t, 5)
	f.release <- struct{}{}
	f.waitReads(t, 6)
	f.release <- struct{}{}
	for _, ch := range []chan result{b1, b2} {
		if r := <-ch; r.err == nil {
			t.Errorf("a recovery from a failed read got no error")
		}
	}

	// A recovery that gives up waiting returns its context's error; the read goes on for others.
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := h.read(ctx, stage)
		gaveUp <- err
	}()
	f.waitReads(t, 7)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("a recovery whose context ended got %v, want context.Canceled", err)
	}
	f.release <- struct{}{}
}
