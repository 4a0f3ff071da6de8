package presence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
)

// Reasons of the logouts the presence service emits itself (SessionEvent.reason).
const (
	// ReasonLeaseEnded: the session's node sent no report for the lease time.
	ReasonLeaseEnded = "lease ended"
	// ReasonNodeRestarted: the session's node came back with a new boot before its lease ended.
	ReasonNodeRestarted = "node restarted"
)

// BucketLeaseEnds is the JetStream KV bucket that elects, for each end of a node's lease, the one
// instance that emits its sessions' logouts: every instance sees the lease end on its own clock,
// and the first to create the key "<node>.<boot>.<seq>" emits, seq being the last of the node's
// stream the instance took in. The seq tells one end from the next of the same boot: a node
// whose reports stopped (a region cut off) and came back can lose its lease again, and its
// sessions' logouts are owed again. Keys live leaseEndsTTL.
const BucketLeaseEnds = "rc_presence_ends"

const (
	leaseEndsTTL = 10 * time.Minute
	// eventsPerPublish bounds one publication of a dead node's logouts, well under NATS's
	// default 1 MiB payload limit.
	eventsPerPublish = 1000
)

// endedNode is a node whose sessions were dropped, with their logins.
type endedNode struct {
	node, boot, reason string
	seq                uint64 // the last of the node's stream taken in before the end
	sessions           []*buspb.SessionEvent
}

func openLeaseEnds(ctx context.Context, nc *nats.Conn, replicas int) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("presence: jetstream: %w", err)
	}
	kv, err := bus.CreateOrUpdateKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketLeaseEnds, History: 1, TTL: leaseEndsTTL, Replicas: max(1, replicas),
		Description: "Roomcast presence: which instance emits the logouts of a node whose lease ended",
	})
	if err != nil {
		return nil, fmt.Errorf("presence: KV bucket %s: %w", BucketLeaseEnds, err)
	}
	return kv, nil
}

// emitLeaseEnd publishes a logout with end.reason for each session of a dropped node, and
// queues them for the webhooks, unless another instance has claimed the node's end first. When
// the claim cannot be made (JetStream unavailable) it emits anyway: an offline event twice is
// better than a ghost that never goes.
func (s *Service) emitLeaseEnd(end endedNode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := s.ends.Create(ctx, fmt.Sprintf("%s.%s.%d", end.node, end.boot, end.seq), []byte(end.reason))
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		s.leaseEndsSkipped.Add(int64(len(end.sessions)))
		s.m.leaseSkipped.Add(float64(len(end.sessions)))
		return // another instance emits them
	case err != nil:
		s.log.Warn("could not claim a node's lease end; emitting its logouts anyway (other instances may too)",
			"node", end.node, "sessions", len(end.sessions), "err", err)
	}
	now := time.Now().UnixMilli()
	evs := make([]*buspb.SessionEvent, len(end.sessions))
	for i, login := range end.sessions {
		evs[i] = &buspb.SessionEvent{
			Kind: buspb.SessionEvent_KIND_LOGOUT, App: login.App, Uid: login.Uid, Room: login.Room,
			Node: login.Node, SessionId: login.SessionId, Device: login.Device, TimeMs: now, Reason: end.reason,
		}
	}
	sortByTime(evs)
	for i := 0; i < len(evs); i += eventsPerPublish {
		s.publishEvents(context.Background(), evs[i:min(i+eventsPerPublish, len(evs))])
	}
	s.leaseEndsEmitted.Add(int64(len(evs)))
	s.m.leaseEmitted.Add(float64(len(evs)))
	s.log.Info("emitted logouts for a node that is gone", "node", end.node, "reason", end.reason, "sessions", len(evs))
}
