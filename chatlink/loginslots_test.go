package chatlink

import (
	"context"
	"testing"
	"time"

	"roomcast/internal/ratelimit"
)

// TestLoginSlots: with LoginConcurrency 2, a third and fourth login past the pace wait until
// one of the first two leaves, one per slot given back, and one whose context ends or whose
// wait passes stops waiting. Without the limit nothing waits.
func TestLoginSlots(t *testing.T) {
	t.Parallel()
	p := newLoginPacer(Limits{LoginConcurrency: 2})
	ctx := context.Background()
	for i := range 2 {
		if !p.enter(ctx, time.Minute) {
			t.Fatalf("login %d did not get a free slot", i)
		}
	}
	in := make(chan int, 2)
	for i := range 2 {
		go func() {
			if p.enter(ctx, time.Minute) {
				in <- i
			}
		}()
	}
	select {
	case i := <-in:
		t.Fatalf("login %d got a slot while both were taken", i)
	case <-time.After(200 * time.Millisecond):
	}
	for range 2 {
		p.leave()
		<-in
		select {
		case i := <-in:
			t.Fatalf("login %d got a slot nobody gave back", i)
		case <-time.After(100 * time.Millisecond):
		}
	}

	gone, cancel := context.WithCancel(ctx)
	cancel()
	if p.enter(gone, time.Minute) {
		t.Error("a login whose context ended got a slot while every slot was taken")
	}
	if p.enter(ctx, 50*time.Millisecond) {
		t.Error("a login got a slot while every slot was taken, after its wait")
	}

	free := newLoginPacer(Limits{LoginRate: ratelimit.Unlimited, LoginConcurrency: -1})
	for range 100 {
		if !free.enter(ctx, time.Minute) {
			t.Fatal("a login waited with no limit")
		}
	}
}
