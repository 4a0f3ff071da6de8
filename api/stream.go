package api

import (
	"errors"
	"io"
	"sync"
	"time"

	"roomcast/internal/bus"
	"roomcast/internal/ratelimit"
	pb "roomcast/proto/roomcastpb"
)

// streamInFlight bounds the sends of one SendStream waiting for their answer (a critical send
// waits for its window): past it the stream reads no more until one is answered, and HTTP/2's
// flow control holds the caller back.
const streamInFlight = 1024

// SendStream implements RoomcastAPI: one send per request, each checked, limited, recorded and
// handed on as SendToRoom would be, in the order read, and answered with its seq as soon as
// its outcome is known. The stream carries many sends without a request's cost for each
// (headers, a connection's read and write per call): for app servers that publish one message
// at a time at a high rate.
func (a *API) SendStream(stream pb.RoomcastAPI_SendStreamServer) error {
	ctx := stream.Context()
	app := appOf(ctx)
	// Each send is a span of its own, under the trace the stream was opened in if it names one.
	authz, streamTrace := mdFirst(ctx, "authorization"), mdFirst(ctx, bus.TraceparentHeader)
	calls := a.m.callMetrics("grpc", "SendStream")

	var sendMu sync.Mutex // a stream's Send is not safe for concurrent use
	var sendErr error
	reply := func(r *pb.StreamSendResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = stream.Send(r)
		}
	}
	// answer records one send's outcome, as a unary call's, and answers it.
	answer := func(req *pb.StreamSendRequest, start time.Time, tp string, rep *pb.SendResponse, err error) {
		r := &pb.StreamSendResponse{Seq: req.Seq}
		var msg string
		if err != nil {
			r.Code, msg = errorCodeOf(err)
			r.Error = msg
		} else {
			r.Id, r.ServerTimeMs = rep.Id, rep.ServerTimeMs
		}
		a.record(calls, start, r.Code, req.GetSend(), authz, true, msg, tp)
		reply(r)
	}

	slots := make(chan struct{}, streamInFlight)
	var wg sync.WaitGroup
	defer wg.Wait() // every send read is answered before the stream ends
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
			code := pb.ErrorCode_ERROR_CODE_API_RATE_LIMITED
			r := &pb.StreamSendResponse{Seq: req.Seq, Code: code, Error: "over the API key's call rate", RetryAfterMs: ratelimit.Millis(retry)}
			a.record(calls, start, code, req.GetSend(), authz, true, r.Error, tp)
			reply(r)
			continue
		}
		send := req.GetSend()
		if send == nil {
			answer(req, start, tp, nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "send is missing"))
			continue
		}
		wait := a.queueSendToRoom(bus.WithTraceparent(ctx, tp), send)
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			rep, err := wait()
			answer(req, start, tp, rep, err)
		})
	}
}
