package sdk_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

// recorder keeps what a Client's callbacks got, in order, for a test to wait on.
type recorder struct {
	mu     sync.Mutex
	msgs   []*clientpb.Message
	events []sdk.Event
	times  []time.Time // when each event came
	log    []string    // bodies and event kinds, in the order the callbacks ran
	closed chan struct{}
}

func newRecorder() *recorder { return &recorder{closed: make(chan struct{})} }

// config returns cfg with the recorder's callbacks.
func (r *recorder) config(cfg sdk.Config) sdk.Config {
	cfg.OnMessage = func(m *clientpb.Message) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.msgs = append(r.msgs, m)
		r.log = append(r.log, string(m.GetBody()))
	}
	cfg.OnEvent = func(ev sdk.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, ev)
		r.times = append(r.times, time.Now())
		r.log = append(r.log, kind(ev))
		if _, ok := ev.(*sdk.ClosedEvent); ok {
			close(r.closed)
		}
	}
	return cfg
}

// kind names an event for the log: "connected", "reconnecting", ...
func kind(ev sdk.Event) string {
	name := fmt.Sprintf("%T", ev)
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "*sdk."), "Event"))
}

// order returns the callback log.
func (r *recorder) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// all returns the events of type T so far.
func all[T sdk.Event](r *recorder) []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []T
	for _, ev := range r.events {
		if e, ok := ev.(T); ok {
			out = append(out, e)
		}
	}
	return out
}

// bodies returns the bodies of the messages so far.
func (r *recorder) bodies() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = string(m.GetBody())
	}
	return out
}

// firstAt returns the first event that match accepts and when it came.
func (r *recorder) firstAt(match func(sdk.Event) bool) (sdk.Event, time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, ev := range r.events {
		if match(ev) {
			return ev, r.times[i], true
		}
	}
	return nil, time.Time{}, false
}

// waitFor waits until an event of type T has arrived and returns the first.
func waitFor[T sdk.Event](t *testing.T, r *recorder, within time.Duration) T {
	t.Helper()
	var got T
	testkit.CheckFor(t, within, 5*time.Millisecond, func() error {
		evs := all[T](r)
		if len(evs) == 0 {
			var zero T
			return fmt.Errorf("no %s event; events: %q", kind(zero), r.order())
		}
		got = evs[0]
		return nil
	})
	return got
}

// waitClosed waits for the ClosedEvent and returns its error.
func (r *recorder) waitClosed(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-r.closed:
	case <-time.After(within):
		t.Fatalf("no closed event in %v; events: %q", within, r.order())
	}
	return all[*sdk.ClosedEvent](r)[0].Err
}
