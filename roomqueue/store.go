package roomqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/proto/clientpb"
)

// Bucket is the JetStream KV bucket of the room queues: one QueueState per room that ever had
// a queue, under "<app>.<room>". A queue that empties keeps its key, so its version never
// starts again from 1.
const Bucket = "rc_room_queues"

// maxAttempts bounds the read-change-write rounds of one change that keeps losing the race.
const maxAttempts = 50

// errContended: other writers changed the queue at every attempt.
var errContended = errors.New("roomqueue: the queue changed under every attempt")

func queueKey(app, room string) string { return app + "." + room }

// splitKey returns a queue key's app and room (names never hold dots).
func splitKey(key string) (app, room string, ok bool) { return strings.Cut(key, ".") }

// store reads and changes queues with compare-and-set on the key's revision: a change is
// written only if nobody wrote the queue since it was read, else it is read and applied again.
type store struct {
	kv      jetstream.KeyValue
	retries prometheus.Counter // rounds lost to another writer
}

func openStore(ctx context.Context, nc *nats.Conn, replicas int, retries prometheus.Counter) (*store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("roomqueue: jetstream: %w", err)
	}
	kv, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, Replicas: max(1, replicas),
		Description: "Roomcast room queues (roomqueue)",
	})
	if err != nil {
		return nil, fmt.Errorf("roomqueue: KV bucket %s: %w", Bucket, err)
	}
	return &store{kv: kv, retries: retries}, nil
}

// read returns a room's queue and its revision (0: none yet).
func (s *store) read(ctx context.Context, app, room string) (*clientpb.QueueState, uint64, error) {
	e, err := s.kv.Get(ctx, queueKey(app, room))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &clientpb.QueueState{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("roomqueue: read %s: %w", room, err)
	}
	var st clientpb.QueueState
	if err := proto.Unmarshal(e.Value(), &st); err != nil {
		return nil, 0, fmt.Errorf("roomqueue: decode %s: %w", room, err)
	}
	return &st, e.Revision(), nil
}

// errNoChange, returned by a change function, leaves the queue as it is.
var errNoChange = errors.New("roomqueue: no change")

// update applies f to the room's queue and writes the result, again from a fresh read as long
// as another writer came first. f is called once per attempt, on a state of its own; its
// error ends the update unwritten (errNoChange: update returns nil state and no error). A
// written change gets the next version.
func (s *store) update(ctx context.Context, app, room string, f func(*clientpb.QueueState) error) (*clientpb.QueueState, error) {
	key := queueKey(app, room)
	for range maxAttempts {
		st, rev, err := s.read(ctx, app, room)
		if err != nil {
			return nil, err
		}
		if err := f(st); errors.Is(err, errNoChange) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		st.Version++
		data, err := proto.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("roomqueue: encode %s: %w", room, err)
		}
		if rev == 0 {
			_, err = s.kv.Create(ctx, key, data)
		} else {
			_, err = s.kv.Update(ctx, key, data, rev)
		}
		switch {
		case err == nil:
			return st, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			s.retries.Inc()
			continue // someone wrote first: read again
		default:
			return nil, fmt.Errorf("roomqueue: write %s: %w", room, err)
		}
	}
	return nil, errContended
}
