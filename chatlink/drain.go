package chatlink

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// Drain stops the node taking logins, tells every client to dispatch again and move to another
// node after a delay spread uniformly over [0, spread) (so they do not all arrive elsewhere at
// once), waits until they have gone or ctx ends, and then shuts the node down, closing whoever
// is left with SHUTDOWN. Zero spread means Config.DrainSpread.
func (n *Node) Drain(ctx context.Context, spread time.Duration) error {
	if spread <= 0 {
		spread = n.cfg.DrainSpread
	}
	if !n.draining.Swap(true) {
		n.log.Info("draining", "spread", spread)
		// The dispatcher hears of it now rather than at the next report.
		if err := bus.Publish(n.cfg.Bus, bus.SubjectLoad, n.loadReport(0)); err != nil {
			n.log.Warn("draining report not published", "err", err)
		}
		n.conns.each(func(c *conn) {
			if c.getState() != stateLive {
				c.close(clientpb.CloseCode_CLOSE_CODE_SHUTDOWN, "node is draining")
				return
			}
			delay := time.Duration(rand.Int64N(int64(spread)))
			c.writeFrame(&clientpb.Frame{Kind: &clientpb.Frame_Reconnect{Reconnect: &clientpb.Reconnect{
				DelayMs: uint32(delay.Milliseconds()), Reason: "node is draining",
			}}})
		})
	}
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for n.conns.len() > 0 {
		select {
		case <-ctx.Done():
			return n.Shutdown(context.Background())
		case <-poll.C:
		}
	}
	return n.Shutdown(ctx)
}

// serveDrain answers an operator's drain request on the node's admin subject. The reply goes
// out at once; the drain runs in the background and ends with the node shut down.
func (n *Node) serveDrain(msg *nats.Msg) {
	var req buspb.DrainRequest
	if err := proto.Unmarshal(msg.Data, &req); err != nil {
		bus.Respond(n.log, msg, &buspb.Reply{Code: uint32(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST), Message: "drain request does not parse"})
		return
	}
	spread := time.Duration(req.SpreadMs) * time.Millisecond
	if spread <= 0 {
		spread = n.cfg.DrainSpread
	}
	deadline := time.Duration(req.DeadlineMs) * time.Millisecond
	if deadline <= 0 {
		deadline = spread + 30*time.Second
	}
	bus.Respond(n.log, msg, &buspb.Reply{Message: "draining"})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := n.Drain(ctx, spread); err != nil {
			n.log.Warn("drain", "err", err)
		}
		close(n.drained)
	}()
}

// Draining says whether the node drains (or has drained): it takes no more logins.
func (n *Node) Draining() bool { return n.draining.Load() }

// Drained is closed when a drain asked for over the bus has shut the node down.
func (n *Node) Drained() <-chan struct{} { return n.drained }
