package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"roomcast/proto/apipb"
)

// runStream publishes like run, over one SendStream of the server API's gRPC listener at addr
// instead of HTTP requests: each message is one send on the stream, sent at its due time, and
// its answer (matched by seq) is its latency. It returns once every message has been answered
// or the stream has ended.
func (p *publisher) runStream(ctx context.Context, addr string, tlsCfg *tls.Config, rate float64, d time.Duration) {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	total := int64(rate * d.Seconds())
	fail := func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.failed += total - p.sent
		p.errors = append(p.errors, err.Error())
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fail(fmt.Errorf("api stream: %w", err))
		return
	}
	defer cc.Close()
	sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.apiKey))
	defer cancel()
	stream, err := apipb.NewRoomcastAPIClient(cc).SendStream(sctx)
	if err != nil {
		fail(fmt.Errorf("api stream: %w", err))
		return
	}

	sentAt := make(map[uint64]time.Time, 1024) // under p.mu: sends not answered yet
	answers := make(chan struct{})
	go func() {
		defer close(answers)
		for {
			r, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					fail(fmt.Errorf("api stream: %w", err))
				}
				return
			}
			now := time.Now()
			p.mu.Lock()
			if at, ok := sentAt[r.Seq]; ok {
				delete(sentAt, r.Seq)
				recordLatency(p.latency, now.Sub(at))
				p.last = now
				if r.Code != 0 {
					p.failed++
					if len(p.errors) < maxErrors {
						p.errors = append(p.errors, fmt.Sprintf("message %d: %s: %s", r.Seq, r.Code, r.Error))
					}
				} else {
					p.ok.add(r.Seq)
				}
			}
			p.mu.Unlock()
		}
	}()

	pace := newPacer(rate)
	defer pace.stop()
	for seq := int64(0); seq < total; seq++ {
		if !pace.wait(ctx, seq) {
			break
		}
		now := time.Now()
		req := &apipb.StreamSendRequest{Seq: uint64(seq), Send: &apipb.SendToRoomRequest{
			Room: p.room, Type: "bench", Lane: p.laneOf(uint64(seq)), BodyBase64: appendBody(nil, p.id, uint64(seq), now.UnixNano(), p.size),
			TagExpr: p.tags.target(uint64(seq)).expr(),
		}}
		if p.textPad {
			randomText(req.Send.BodyBase64[bodyHeader:])
		}
		p.mu.Lock()
		if p.first.IsZero() {
			p.first = now
		}
		sentAt[uint64(seq)] = now
		p.sent++
		p.mu.Unlock()
		if err := stream.Send(req); err != nil {
			break // Recv reports why
		}
	}
	_ = stream.CloseSend()
	<-answers
	p.mu.Lock()
	p.failed += int64(len(sentAt)) // sent, never answered
	p.mu.Unlock()
}
