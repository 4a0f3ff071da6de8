package bus

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// replyMux takes the answers to many requests that are each answered by several messages (a
// batched direct get's stream of messages) on one wildcard subscription of a connection, where
// a subscription per request would cost a SUB and an UNSUB to the server and a goroutine for
// each: a real share of the work when a node's 15,000 clients log in again at once and each
// recovers its room's history. nats.go's own request mux (Conn.Request) keeps one answer per
// request, so it cannot serve these.
//
// The subscription's callback only queues a message for the goroutine that made the request,
// which decodes it: one slow reader does not hold up the others' answers. nats.go sends the
// subscription again after a reconnect; it ends when the connection closes, and so does the mux.
type replyMux struct {
	prefix string // "_INBOX.<unique>.": a request's reply subject is prefix + its token

	// late counts the answers that came after their request had finished (given up, or ended
	// by a status): dropped, and not logged, as a read that gave up has reported its error.
	late atomic.Uint64

	mu     sync.Mutex // guards the fields below and every replyWait's queue
	tokens uint64     // the next request's token
	waits  map[string]*replyWait
	closed bool
}

// replyWait is one request's answers, queued for the goroutine that waits for them.
type replyWait struct {
	reply string        // the request's reply subject
	wake  chan struct{} // one slot: something was queued
	held  []*nats.Msg   // taken from queue, not yet returned by next; the reader's own

	// Guarded by replyMux.mu.
	queue []*nats.Msg
	err   error // set when the connection closed
}

var (
	replyMuxes  sync.Map   // *nats.Conn -> *replyMux, made by Connect or on a connection's first read
	replyMuxNew sync.Mutex // serializes making one, so a connection gets one subscription
)

// replyMuxOf returns nc's reply mux, subscribing it on first use.
func replyMuxOf(nc *nats.Conn) (*replyMux, error) {
	if m, ok := replyMuxes.Load(nc); ok {
		return m.(*replyMux), nil
	}
	replyMuxNew.Lock()
	defer replyMuxNew.Unlock()
	if m, ok := replyMuxes.Load(nc); ok {
		return m.(*replyMux), nil
	}
	m := &replyMux{prefix: nc.NewInbox() + ".", waits: make(map[string]*replyWait)}
	sub, err := nc.Subscribe(m.prefix+"*", m.deliver)
	if err != nil {
		return nil, err
	}
	// A limit would make a burst of answers a slow consumer and drop a message from the middle
	// of some read. What is pending stays bounded without one: by the reads in flight, each
	// answered by at most a batch, as when each read had its own subscription.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	replyMuxes.Store(nc, m)
	sub.SetClosedHandler(func(string) { m.shut(nc) })
	if !sub.IsValid() { // closed before the handler was set
		m.shut(nc)
	}
	return m, nil
}

// RequestAnswers publishes body to subject with a reply subject on nc's reply mux, and hands
// the answers to each, in the order they came, on the caller's goroutine, until each reports
// the answer done. It fails when ctx ends or the connection closes first; answers that come
// after it returned are dropped. For requests answered by several messages, such as JetStream's
// batched direct gets.
func RequestAnswers(ctx context.Context, nc *nats.Conn, subject string, body []byte, each func(*nats.Msg) (done bool)) error {
	mux, err := replyMuxOf(nc)
	if err != nil {
		return err
	}
	w, err := mux.open()
	if err != nil {
		return err
	}
	defer mux.end(w)
	if err := nc.PublishRequest(subject, w.reply, body); err != nil {
		return err
	}
	for {
		msg, err := mux.next(ctx, w)
		if err != nil {
			return err
		}
		if each(msg) {
			return nil
		}
	}
}

// deliver is the subscription's callback: it queues msg for the request its reply token names.
func (m *replyMux) deliver(msg *nats.Msg) {
	token := strings.TrimPrefix(msg.Subject, m.prefix)
	m.mu.Lock()
	w := m.waits[token]
	if w != nil {
		w.queue = append(w.queue, msg)
	}
	m.mu.Unlock()
	if w == nil {
		m.late.Add(1)
		return
	}
	select {
	case w.wake <- struct{}{}:
	default: // already woken
	}
}

// shut ends the mux when its subscription closed (the connection did): waiting requests fail
// and the next read of a new connection makes a new mux. It may be called twice.
func (m *replyMux) shut(nc *nats.Conn) {
	replyMuxes.CompareAndDelete(nc, m)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for token, w := range m.waits {
		w.err = nats.ErrConnectionClosed
		delete(m.waits, token)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// open registers a request: its answers are those sent to w.reply. The caller must end it.
func (m *replyMux) open() (*replyWait, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nats.ErrConnectionClosed
	}
	token := strconv.FormatUint(m.tokens, 36)
	m.tokens++
	w := &replyWait{reply: m.prefix + token, wake: make(chan struct{}, 1)}
	m.waits[token] = w
	return w, nil
}

// end deregisters w: answers still queued and those that come after are dropped.
func (m *replyMux) end(w *replyWait) {
	m.mu.Lock()
	delete(m.waits, w.reply[len(m.prefix):])
	m.late.Add(uint64(len(w.queue) + len(w.held)))
	w.queue, w.held = nil, nil
	m.mu.Unlock()
}

// next returns w's next answer, in the order they came, waiting for one if none is queued. It
// fails when ctx ends with nothing queued, or when the connection closed.
func (m *replyMux) next(ctx context.Context, w *replyWait) (*nats.Msg, error) {
	for len(w.held) == 0 {
		m.mu.Lock()
		w.held, w.queue = w.queue, nil
		err := w.err
		m.mu.Unlock()
		if len(w.held) > 0 {
			break
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	msg := w.held[0]
	w.held = w.held[1:]
	return msg, nil
}
