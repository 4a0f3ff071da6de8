// Package bus is the plumbing every Roomcast role shares to talk over NATS: subject names,
// connecting, request/reply with protobuf payloads, and JetStream's batched direct gets
// (directget.go; the answers come on one reply subscription per connection, replymux.go), with
// which the ChatLinks and the room service read a room's history (store/historystore). It
// holds no business logic nor the definition of stored data (store/), and it does not run a
// NATS server: the embedded one of `roomcast dev` and tests is internal/roles/devnats.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/tracing"
)

// Subjects. Services subscribe to the rc.svc.* subjects in queue groups named after the service,
// so any number of instances share the work and none needs discovery.
//
// The rc.sessions.* subjects are each ChatLink's session stream: event batches, snapshots and
// reports, numbered in one sequence per node. Every instance of a service that keeps a view of
// the sessions subscribes to all of it (not in a queue group), with one subscription so that a
// node's messages are handled in order.
const (
	SubjectRoomJoin      = "rc.svc.room.join"
	SubjectRoomSend      = "rc.svc.room.send"
	SubjectRoomSendBatch = "rc.svc.room.sendbatch"
	SubjectRoomInfo      = "rc.svc.room.info"
	SubjectRoomHistory   = "rc.svc.room.history"
	SubjectRoomRecall    = "rc.svc.room.recall"
	// SubjectRoomCounters takes a room's counter windows (CounterWindow, answered with a Reply).
	SubjectRoomCounters = "rc.svc.room.counters"
	// SubjectRoomViewers takes a ChatLink's viewer window (ViewerWindow, answered with a Reply).
	SubjectRoomViewers = "rc.svc.room.viewers"
	// SubjectRoomModerate takes a moderator's request from its ChatLink (ModerateBusRequest,
	// answered with a Reply).
	SubjectRoomModerate = "rc.svc.room.moderate"
	// SubjectRoomAttributes takes a member's change of its room's attributes (AttributeRequest,
	// answered with a Reply).
	SubjectRoomAttributes = "rc.svc.room.attributes"

	// SubjectQueue is the room queue service's (QueueBusRequest, answered with a Reply).
	SubjectQueue = "rc.svc.queue"

	SubjectPresenceCount    = "rc.svc.presence.count"
	SubjectPresenceSessions = "rc.svc.presence.sessions"

	SubjectSessions         = "rc.sessions.*"
	SubjectPresenceEvents   = "rc.sessions.events"
	SubjectSessionsSnapshot = "rc.sessions.snapshot"
	SubjectSessionsReport   = "rc.sessions.report"

	// SubjectNodesControl reaches every ChatLink (bans, room closes, resync requests).
	SubjectNodesControl = "rc.nodes.control"

	SubjectLoad = "rc.load"

	// SubjectCdnPushers carries the CDN pushers' reports (PusherReport): their leases.
	SubjectCdnPushers = "rc.cdn.pushers"
)

// CdnPushSubject is where the room service hands a pusher instance the CDN-lane messages of the
// rooms it writes (CdnBatch).
func CdnPushSubject(pusher string) string { return "rc.cdn.push." + pusher }

// FollowKV calls apply with every key's current value, then with every change (a nil value for
// a deleted key), from one goroutine, in order. It returns once the current values are applied,
// or with an error when that takes longer than ctx allows. stop ends the watch and waits for
// the goroutine.
func FollowKV(ctx context.Context, kv jetstream.KeyValue, apply func(key string, value []byte)) (stop func(), err error) {
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		return nil, fmt.Errorf("bus: watch %s: %w", kv.Bucket(), err)
	}
	loaded := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			switch {
			case e == nil: // the end of the current values
				close(loaded)
			case e.Operation() == jetstream.KeyValuePut:
				apply(e.Key(), e.Value())
			default:
				apply(e.Key(), nil)
			}
		}
	}()
	stop = func() {
		_ = w.Stop()
		<-done
	}
	select {
	case <-loaded:
		return stop, nil
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("bus: loading %s: %w", kv.Bucket(), ctx.Err())
	}
}

// AppEventsSubject carries an app's online/offline events (SessionEvents) for app backends.
func AppEventsSubject(app string) string { return "rc.app." + app + ".sessions" }

// SubjectAppEvents matches every app's AppEventsSubject.
const SubjectAppEvents = "rc.app.*.sessions"

// RoomSubject is the broadcast subject of a room. app and room must be valid names
// (auth.ValidName), which keeps dots and wildcards out.
func RoomSubject(app, room string) string { return "rc.room." + app + "." + room }

// DrainSubject is where an operator asks a ChatLink to drain.
func DrainSubject(node string) string { return "rc.admin." + node + ".drain" }

// NodeSubject is the subject a ChatLink listens on for messages addressed to it.
func NodeSubject(node string) string { return "rc.node." + node }

// Connect dials NATS at url with the options every role wants: a name, endless reconnects and
// logging of disconnects (log may be nil), and the connection's reply mux for answers in
// several messages (RequestAnswers); opts add to them (nats.InProcessServer, for roles in the
// same process as an embedded server).
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect %s: %w", url, err)
	}
	// The reply mux (replymux.go) lives as long as the connection: made here, its
	// subscription and goroutine are there from the start rather than from the first read.
	if _, err := replyMuxOf(nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: connect %s: reply subscription: %w", url, err)
	}
	return nc, nil
}

// Request sends req on subject and decodes the answer into resp. With tracing on it is a
// client span ("bus request") whose context travels in the message's traceparent header;
// with tracing off, a traceparent ctx carries (WithTraceparent) travels there.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, resp proto.Message) error {
	data, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("bus: encode %s: %w", subject, err)
	}
	out := &nats.Msg{Subject: subject, Data: data}
	var span trace.Span // nil while tracing is off
	if tracing.Enabled() {
		ctx, span = tracing.Start(ctx, "bus request", trace.SpanKindClient, trace.WithAttributes(
			attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", subject)))
		defer span.End()
	}
	out.Header = traceHeader(ctx)
	msg, err := nc.RequestMsgWithContext(ctx, out)
	if err != nil {
		if span != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		return fmt.Errorf("bus: request %s: %w", subject, err)
	}
	if err := proto.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("bus: decode reply of %s: %w", subject, err)
	}
	return nil
}

// Respond encodes resp as the reply to msg. A failure is logged (the requester times out),
// except for a message that wants no reply and a connection closed by shutdown.
func Respond(log *slog.Logger, msg *nats.Msg, resp proto.Message) {
	if msg.Reply == "" {
		return
	}
	data, err := proto.Marshal(resp)
	if err == nil {
		err = msg.Respond(data)
	}
	if err != nil && !errors.Is(err, nats.ErrMsgNoReply) && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("bus: respond", "subject", msg.Subject, "err", err)
	}
}

// Publish encodes m and publishes it on subject.
func Publish(nc *nats.Conn, subject string, m proto.Message) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("bus: encode %s: %w", subject, err)
	}
	return nc.Publish(subject, data)
}
