package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/ratelimit"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// streamInFlight bounds the sends of one SendStream waiting for their answer (a critical send
// waits for its window): past it the stream reads no more until one is answered, and HTTP/2's
// flow control holds the caller back.
const streamInFlight = 1024

// streamAuditEvery is how often a SendStream's accepted sends are summed up in the audit trail
// (and once more when the stream ends).
const streamAuditEvery = 10 * time.Second

// SendStream implements RoomcastAPI: one send per request, each checked, limited, counted and
// handed on as SendToRoom would be, in the order read, and answered with its seq as soon as
// its outcome is known. The stream carries many sends without a request's cost for each
// (headers, a connection's read and write per call): for app servers that publish one message
// at a time at a high rate.
//
// A send whose outcome is known at once (a normal or bulk one, or a refusal) is answered by the
// loop that reads the stream; those that wait (a critical send for its window, any send that
// goes over NATS) are answered in the order read by one goroutine of the stream's. A send over
// NATS is made on a goroutine of its own. Accepted sends are audited as a sum per room (every
// streamAuditEvery, and at the end), refused ones one by one.
func (a *API) SendStream(stream apipb.RoomcastAPI_SendStreamServer) error {
	ctx := stream.Context()
	app := appOf(ctx)
	// Each send is a span of its own, under the trace the stream was opened in if it names one.
	authz, streamTrace := mdFirst(ctx, "authorization"), mdFirst(ctx, bus.TraceparentHeader)
	calls := a.m.callMetrics("grpc", "SendStream")
	audit := &streamAudit{a: a, calls: calls, authz: authz, traceparent: streamTrace, rooms: map[string]*roomSends{}}
	defer audit.flush()

	var sendMu sync.Mutex // a stream's Send is not safe for concurrent use
	var sendErr error
	reply := func(r *apipb.StreamSendResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = stream.Send(r)
		}
	}
	// answer records one send's outcome and answers it.
	answer := func(req *apipb.StreamSendRequest, start time.Time, tp string, rep *apipb.SendResponse, err error) {
		r := &apipb.StreamSendResponse{Seq: req.Seq}
		var msg string
		if err != nil {
			r.Code, msg = errorCodeOf(err)
			r.Error = msg
		} else {
			r.Id, r.ServerTimeMs = rep.Id, rep.ServerTimeMs
			audit.add(req.GetSend().GetRoom(), rep.Id)
		}
		a.record(calls, start, r.Code, req.GetSend(), authz, err != nil, msg, tp)
		reply(r)
	}

	// The sends that wait, in the order read, for the answering goroutine.
	type waiting struct {
		req   *apipb.StreamSendRequest
		start time.Time
		tp    string
		wait  func() (*apipb.SendResponse, error)
	}
	waits := make(chan waiting, streamInFlight)
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		tick := time.NewTicker(streamAuditEvery)
		defer tick.Stop()
		for {
			select {
			case w, ok := <-waits:
				if !ok {
					return
				}
				rep, err := w.wait()
				answer(w.req, w.start, w.tp, rep, err)
			case <-tick.C:
				audit.flush()
			}
		}
	}()
	// Every send read is answered before the stream ends.
	defer func() {
		close(waits)
		<-answered
	}()

	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		start := time.Now()
		tp := bus.ChildTraceparent(streamTrace)
		if ok, retry := a.takeCall(ctx, app, authz); !ok {
			code := clientpb.ErrorCode_ERROR_CODE_API_RATE_LIMITED
			r := &apipb.StreamSendResponse{Seq: req.Seq, Code: code, Error: "over the API key's call rate", RetryAfterMs: ratelimit.Millis(retry)}
			a.record(calls, start, code, req.GetSend(), authz, true, r.Error, tp)
			reply(r)
			continue
		}
		send := req.GetSend()
		if send == nil {
			answer(req, start, tp, nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "send is missing"))
			continue
		}
		q := a.queueSendToRoom(bus.WithTraceparent(ctx, tp), send)
		switch {
		case !q.waits:
			rep, err := q.wait()
			answer(req, start, tp, rep, err)
			continue
		case q.remote:
			// Made now, on a goroutine of its own, and answered in turn.
			done, ask := make(chan struct{}), q.wait
			var rep *apipb.SendResponse
			var err error
			go func() {
				defer close(done)
				rep, err = ask()
			}()
			q.wait = func() (*apipb.SendResponse, error) {
				<-done
				return rep, err
			}
		}
		waits <- waiting{req: req, start: start, tp: tp, wait: q.wait}
	}
}

// streamAudit sums up a SendStream's accepted sends for the audit trail: one record per room
// every streamAuditEvery, and at the end of the stream, instead of one a message.
type streamAudit struct {
	a           *API
	calls       *callMetrics
	authz       string
	traceparent string // the stream's, if it was opened with one

	mu    sync.Mutex
	rooms map[string]*roomSends
}

// roomSends are the sends to one room since the last record.
type roomSends struct {
	n           int
	first, last string // the least and the greatest message id (ids sort by time)
}

func (s *streamAudit) add(room, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rooms[room]
	if r == nil {
		r = &roomSends{first: id, last: id}
		s.rooms[room] = r
	}
	r.n++
	r.first, r.last = min(r.first, id), max(r.last, id)
}

// flush writes one record per room sent to since the last, in the order of the room names.
func (s *streamAudit) flush() {
	s.mu.Lock()
	rooms := s.rooms
	s.rooms = map[string]*roomSends{}
	s.mu.Unlock()
	if len(rooms) == 0 || !s.a.audit.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	trace, _ := bus.TraceID(s.traceparent)
	for _, room := range slices.Sorted(maps.Keys(rooms)) {
		r := rooms[room]
		attrs := append(s.a.auditCaller(s.calls, s.authz),
			slog.String("room", room), slog.String("result", "OK"), slog.Int("sends", r.n),
			slog.String("first_id", r.first), slog.String("last_id", r.last))
		if trace != "" {
			attrs = append(attrs, slog.String("trace_id", trace))
		}
		s.a.audit.LogAttrs(context.Background(), slog.LevelInfo, "api sends", attrs...)
	}
}
