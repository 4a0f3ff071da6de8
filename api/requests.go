package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
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
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	start := time.Now()
	err := bus.Request(ctx, a.cfg.Bus, subject, req, rep)
	a.m.observeBus(subject, start)
	if err != nil {
		return a.internal("request "+subject, err)
	}
	return refusal(rep)
}

// refusal returns the API error of a service's reply that refuses, or nil.
func refusal(rep codedReply) error {
	if code := rep.GetCode(); code != 0 {
		return apiError(pb.ErrorCode(code), "%s", rep.GetMessage())
	}
	return nil
}

// sessionsOf asks presence for the sessions of uids.
func (a *API) sessionsOf(ctx context.Context, app string, uids ...string) ([]*pb.SessionEvent, error) {
	var rep pb.PresenceReply
	if err := a.ask(ctx, bus.SubjectPresenceSessions, &pb.PresenceQuery{App: app, Uids: uids}, &rep); err != nil {
		return nil, err
	}
	return rep.Sessions, nil
}

// toNodes sends a control request to the node of each group of sessions and adds up what they
// did.
func (a *API) toNodes(ctx context.Context, sessions []*pb.SessionEvent, req *pb.NodeControl) (int64, error) {
	byNode := make(map[string][]string)
	for _, s := range sessions {
		byNode[s.Node] = append(byNode[s.Node], s.SessionId)
	}
	var total int64
	for node, ids := range byNode {
		r := proto.CloneOf(req)
		r.Sessions = ids
		var rep pb.NodeControlReply
		if err := a.ask(ctx, bus.NodeSubject(node), r, &rep); err != nil {
			return total, err
		}
		total += rep.Affected
	}
	return total, nil
}

// broadcast tells every ChatLink, and makes sure the NATS server has it before returning.
func (a *API) broadcast(req *pb.NodeControl) error {
	if err := bus.Publish(a.cfg.Bus, bus.SubjectNodesControl, req); err != nil {
		return a.internal("tell the nodes", err)
	}
	if err := a.cfg.Bus.Flush(); err != nil {
		return a.internal("tell the nodes", err)
	}
	return nil
}
