package cdnpusher

import (
	"bytes"
	"context"
	"math/rand/v2"
	"time"

	"github.com/minio/minio-go/v7"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"roomcast/internal/tracing"
	"roomcast/proto/segment"
)

// s3Store writes segments to an S3 bucket with the headers docs/cdn.md promises clients.
type s3Store struct {
	client *minio.Client
	bucket string
}

var _ store = (*s3Store)(nil)

func (s *s3Store) put(ctx context.Context, key string, body []byte) error {
	_, err := s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{
		ContentType:     segment.ContentType,
		ContentEncoding: segment.ContentEncoding,
		CacheControl:    segment.CacheControl,
		// A plain PUT, not minio-go's aws-chunked streaming upload (its default over plain
		// HTTP): some S3 servers (versitygw among them) keep "aws-chunked" in the stored
		// Content-Encoding, and a browser cannot decode "aws-chunked,gzip". The body is small
		// and in memory, so Content-MD5 protects it instead of signed chunks.
		DisableContentSha256: true,
		SendContentMd5:       true,
	})
	return err
}

// runWriter writes queued segments until the queue is closed and empty.
func (p *Pusher) runWriter() {
	defer p.writers.Done()
	for {
		s, ok := p.queue.pop()
		if !ok {
			return
		}
		p.write(s)
	}
}

// write puts one segment, retrying with exponential backoff (and jitter, so that writers do
// not hammer a recovering store in step) until it succeeds, it is older than GiveUpAfter, or
// Close gives up. With tracing on it is a span, "cdn segment write", in the trace of the first
// traced batch whose messages the segment holds (linked to the others), or of its own.
func (p *Pusher) write(s pending) {
	span := startWriteSpan(s)
	defer span.End()
	backoff := p.cfg.RetryMin
	for attempt := 0; ; attempt++ {
		if span.IsRecording() {
			span.SetAttributes(attribute.Int("roomcast.attempts", attempt+1))
		}
		if p.abort.Err() != nil {
			p.gap(s, gapShutdown)
			span.SetStatus(codes.Error, gapShutdown)
			return
		}
		if attempt > 0 {
			p.metrics.retries.Inc()
		}
		ctx, cancel := context.WithTimeout(p.abort, p.cfg.WriteTimeout)
		start := time.Now()
		err := p.store.put(ctx, s.key, s.body)
		cancel()
		if err == nil {
			p.metrics.writeSeconds.Observe(time.Since(start).Seconds())
			p.metrics.segments.Inc()
			p.metrics.bytes.Add(float64(len(s.body)))
			if s.empty {
				p.metrics.emptySegs.Inc()
			}
			if p.storageDown.CompareAndSwap(true, false) {
				p.cfg.Logger.Info("cdnpusher: storage writes again", "key", s.key)
			}
			return
		}
		p.metrics.failures.Inc()
		if p.storageDown.CompareAndSwap(false, true) {
			p.cfg.Logger.Warn("cdnpusher: storage write failed; retrying", "key", s.key, "err", err)
		}
		if time.Since(s.closed) > p.cfg.GiveUpAfter {
			p.gap(s, gapGaveUp)
			span.SetStatus(codes.Error, err.Error())
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, p.cfg.RetryMax)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.abort.Done():
			t.Stop()
		}
	}
}

// startWriteSpan begins the span of a segment's write: under the first traced batch that
// brought its messages, linked to the rest. With tracing off it records nothing.
func startWriteSpan(s pending) trace.Span {
	ctx := context.Background()
	if !tracing.Enabled() {
		return trace.SpanFromContext(ctx)
	}
	var links []trace.Link
	if len(s.traced) > 0 {
		ctx = trace.ContextWithSpanContext(ctx, s.traced[0])
		for _, sc := range s.traced[1:] {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	_, span := tracing.Start(ctx, "cdn segment write", trace.SpanKindClient, trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("roomcast.segment.key", s.key), attribute.Int("roomcast.segment.bytes", len(s.body)),
			attribute.Bool("roomcast.segment.empty", s.empty)))
	return span
}
