package api

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/clientpb"
)

// How the API asks the room and presence services and the ChatLinks over NATS.

func (a *API) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.cfg.Timeout)
}

// codedReply is a service's answer that carries an error code (Reply, NodeControlReply,
// PresenceReply).
type codedReply interface {
	proto.Message
	GetCode() uint32
	GetMessage() string
}

// ask sends a request to a service and decodes the answer. An answer with an error code is
// that error.
func (a *API) ask(ctx context.Context, subject string, req proto.Message, rep codedReply) error {
	if err := a.request(ctx, subject, req, rep); err != nil {
		return a.internal("request "+subject, err)
	}
	return refusal(rep)
}

// readRetryPause is how long a read that found no responder waits before it asks again: a
// service instance that is starting subscribes within moments.
const readRetryPause = 100 * time.Millisecond

// read is ask for a request that only reads, which may therefore be asked twice: when the
// first ask goes unanswered (it timed out, as when the instance that took it from the queue
// group was killed, or it found no responder) it is asked once more, within its own Timeout,
// counted (roomcast_api_bus_read_retries_total) and logged. Nothing that changes state goes
// through read.
func (a *API) read(ctx context.Context, subject string, req proto.Message, rep codedReply) error {
	err := a.request(ctx, subject, req, rep)
	if err != nil && unanswered(err) && ctx.Err() == nil {
		a.m.retries.WithLabelValues(busLabel(subject)).Inc()
		a.log.Warn("read not answered; asking once more", "subject", subject, "err", err)
		if errors.Is(err, nats.ErrNoResponders) {
			select {
			case <-time.After(readRetryPause):
			case <-ctx.Done():
			}
		}
		proto.Reset(rep)
		err = a.request(ctx, subject, req, rep)
	}
	if err != nil {
		return a.internal("request "+subject, err)
	}
	return refusal(rep)
}

// unanswered reports whether a bus request failed for want of an answer.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// request sends a request over NATS within Timeout and decodes the answer; it times the round
// trip.
func (a *API) request(ctx context.Context, subject string, req proto.Message, rep proto.Message) error {
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	start := time.Now()
	err := bus.Request(ctx, a.cfg.Bus, subject, req, rep)
	a.m.observeBus(subject, start)
	return err
}

// refusal returns the API error of a service's reply that refuses, or nil.
func refusal(rep codedReply) error {
	if code := rep.GetCode(); code != 0 {
		return apiError(clientpb.ErrorCode(code), "%s", rep.GetMessage())
	}
	return nil
}

// sessionsOf asks presence for the sessions of uids.
func (a *API) sessionsOf(ctx context.Context, app string, uids ...string) ([]*buspb.SessionEvent, error) {
	var rep buspb.PresenceReply
	if err := a.read(ctx, bus.SubjectPresenceSessions, &buspb.PresenceQuery{App: app, Uids: uids}, &rep); err != nil {
		return nil, err
	}
	return rep.Sessions, nil
}

// toNodes sends a control request to the node of each group of sessions and adds up what they
// did.
func (a *API) toNodes(ctx context.Context, sessions []*buspb.SessionEvent, req *buspb.NodeControl) (int64, error) {
	byNode := make(map[string][]string)
	for _, s := range sessions {
		byNode[s.Node] = append(byNode[s.Node], s.SessionId)
	}
	var total int64
	for node, ids := range byNode {
		r := proto.CloneOf(req)
		r.Sessions = ids
		var rep buspb.NodeControlReply
		if err := a.ask(ctx, bus.NodeSubject(node), r, &rep); err != nil {
			return total, err
		}
		total += rep.Affected
	}
	return total, nil
}

// broadcast tells every ChatLink, and makes sure the NATS server has it before returning.
func (a *API) broadcast(req *buspb.NodeControl) error {
	if err := bus.Publish(a.cfg.Bus, bus.SubjectNodesControl, req); err != nil {
		return a.internal("tell the nodes", err)
	}
	if err := a.cfg.Bus.Flush(); err != nil {
		return a.internal("tell the nodes", err)
	}
	return nil
}
