package cdnpusher

import (
	"bytes"
	"context"
	"math/rand/v2"
	"time"

	"github.com/minio/minio-go/v7"

	"roomcast/cdnpusher/segment"
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
// Close gives up.
func (p *Pusher) write(s pending) {
	backoff := p.cfg.RetryMin
	for attempt := 0; ; attempt++ {
		if p.abort.Err() != nil {
			p.gap(s, gapShutdown)
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
