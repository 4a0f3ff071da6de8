package chatlink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"roomcast/internal/bus"
)

// NodesBucket is the JetStream KV bucket where ChatLinks lease their names. A name is the
// prefix of every session id the node hands out, so two live nodes must never share one.
const NodesBucket = "rc_nodes"

// leaseTTL is how long a lease lives without a refresh: a crashed node's name is free again
// after it.
const leaseTTL = 15 * time.Second

// ErrNameHeld is returned by Node.Start when another node holds the node's name: a live one, or
// one that stopped without releasing it (killed), whose lease runs out within leaseTTL.
var ErrNameHeld = errors.New("node name held")

// nameLease holds a node's name in NodesBucket while the node runs. It is the JetStream lease on
// the name alone, kept so two live nodes never hand out the same session ids; the services'
// lease on the node's sessions is the session report (stream.go).
type nameLease struct {
	kv  jetstream.KeyValue
	key string
	rev uint64
}

func acquireNameLease(ctx context.Context, n *Node) (*nameLease, error) {
	kv, err := bus.CreateOrUpdateKeyValue(ctx, n.js, jetstream.KeyValueConfig{Bucket: NodesBucket, TTL: leaseTTL, Replicas: max(1, n.cfg.KVReplicas), Description: "Roomcast ChatLink name leases"})
	if err != nil {
		return nil, fmt.Errorf("chatlink: node lease bucket: %w", err)
	}
	l := &nameLease{kv: kv, key: n.cfg.Node}
	l.rev, err = kv.Create(ctx, l.key, []byte(n.WSURL()))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("chatlink: %w: %q is leased by another node, live or stopped without releasing it; the lease ends %s unless that node renews it",
			ErrNameHeld, n.cfg.Node, leaseEnds(ctx, kv, l.key))
	}
	if err != nil {
		return nil, fmt.Errorf("chatlink: lease node name: %w", err)
	}
	return l, nil
}

// leaseEnds says when the lease on key runs out if nobody renews it: "in 12s".
func leaseEnds(ctx context.Context, kv jetstream.KeyValue, key string) string {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return fmt.Sprintf("within %v", leaseTTL)
	}
	left := max(time.Until(e.Created().Add(leaseTTL)), 0)
	return fmt.Sprintf("in %v", left.Round(time.Second))
}

// renewLoop renews the name lease every third of its TTL until ctx ends, then releases it.
func (l *nameLease) renewLoop(ctx context.Context, n *Node) {
	t := time.NewTicker(leaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := l.kv.Delete(rctx, l.key, jetstream.LastRevision(l.rev)); err != nil {
				n.log.Warn("node lease not released", "err", err)
			}
			cancel()
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			rev, err := l.kv.Update(rctx, l.key, []byte(n.WSURL()), l.rev)
			if err != nil {
				// Lost it (the bus was out of reach longer than the TTL): take it again, unless
				// another node has it now, which the operator must hear about.
				rev, err = l.kv.Create(rctx, l.key, []byte(n.WSURL()))
			}
			cancel()
			if err != nil {
				n.log.Error("node lease lost: another node may hand out colliding session ids", "err", err)
				continue
			}
			l.rev = rev
		}
	}
}
