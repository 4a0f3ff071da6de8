// Package devs3 runs an S3-compatible object store in the process (gofakes3, in memory) for
// `roomcast dev`, so the CDN path works with no setup: the pushers write their segments to it
// over the S3 API on a loopback port, and Origin serves them over plain HTTP as a CDN origin
// does (ETag, Cache-Control, CORS). It keeps objects for a while and then forgets them, so a
// long dev session does not grow without bound. It is for development only: no credentials are
// checked and nothing survives a restart. Tests of the pusher against a real S3 server use
// internal/testkit/s3test.
package devs3

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"roomcast/proto/segment"
)

// Config configures the store.
type Config struct {
	// Listen is the address of the S3 API. Zero value means 127.0.0.1:0.
	Listen string
	// Bucket is created at start. Zero value means "roomcast".
	Bucket string
	// Retention is how long an object is kept. Zero value means 10m.
	Retention time.Duration
	// Log receives the store's errors. Zero value means none.
	Log *slog.Logger
}

// Server is a running store.
type Server struct {
	cfg     Config
	backend *s3mem.Backend
	ln      net.Listener
	srv     *http.Server

	stop      chan struct{}
	wg        sync.WaitGroup // the HTTP server and the janitor
	closeOnce sync.Once
}

// Start starts the store and creates its bucket.
func Start(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Bucket == "" {
		cfg.Bucket = "roomcast"
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 10 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, backend: s3mem.New(), stop: make(chan struct{})}
	if err := s.backend.CreateBucket(cfg.Bucket); err != nil {
		return nil, fmt.Errorf("devs3: create bucket: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("devs3: listen on %s: %w", cfg.Listen, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: gofakes3.New(s.backend).Server(), ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error("devs3: serve", "err", err)
		}
	}()
	go s.janitor()
	return s, nil
}

// Endpoint returns the S3 API's host:port (plain HTTP; any credentials are accepted).
func (s *Server) Endpoint() string { return s.ln.Addr().String() }

// Bucket returns the bucket's name.
func (s *Server) Bucket() string { return s.cfg.Bucket }

// Close stops the store; its objects are gone. It may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		_ = s.srv.Close()
		s.wg.Wait()
	})
}

// janitor forgets objects older than the retention, every tenth of it.
func (s *Server) janitor() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Retention / 10)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.expire(now.Add(-s.cfg.Retention))
		}
	}
}

// expire deletes the objects last modified before cutoff.
func (s *Server) expire(cutoff time.Time) {
	list, err := s.backend.ListBucket(s.cfg.Bucket, nil, gofakes3.ListBucketPage{})
	if err != nil {
		s.cfg.Log.Warn("devs3: list bucket", "err", err)
		return
	}
	var old []string
	for _, c := range list.Contents {
		if c.LastModified.Before(cutoff) {
			old = append(old, c.Key)
		}
	}
	if len(old) > 0 {
		if _, err := s.backend.DeleteMulti(s.cfg.Bucket, old...); err != nil {
			s.cfg.Log.Warn("devs3: delete old objects", "err", err)
		}
	}
}

// negativeMaxAge is how long a CDN may cache a 404: long enough that a crowd polling for a
// segment not written yet reaches the origin about once a second, short enough that the
// segment shows soon after it is written.
const negativeMaxAge = "public, max-age=1"

// Origin serves the bucket's objects as a CDN origin: GET or HEAD /{key}, with the stored
// Content-Type and Content-Encoding, an ETag (the MD5 of the body, so If-None-Match answers
// 304), Cache-Control for immutable objects (a segment never changes), and CORS for any origin
// so a web page can poll segments. A missing object is a 404 that caches for a second.
func (s *Server) Origin() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", "ETag, Content-Length")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodOptions:
			h.Set("Access-Control-Allow-Methods", "GET, HEAD")
			h.Set("Access-Control-Allow-Headers", "If-None-Match")
			h.Set("Access-Control-Max-Age", "86400")
			w.WriteHeader(http.StatusNoContent)
			return
		default:
			h.Set("Allow", "GET, HEAD, OPTIONS")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		key := strings.TrimPrefix(r.URL.Path, "/")
		obj, err := s.backend.GetObject(s.cfg.Bucket, key, nil)
		if err != nil {
			h.Set("Cache-Control", negativeMaxAge)
			http.Error(w, "no such segment", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(obj.Contents)
		_ = obj.Contents.Close()
		if err != nil {
			http.Error(w, "read failed", http.StatusInternalServerError)
			return
		}
		sum := md5.Sum(body)
		h.Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
		h.Set("Cache-Control", segment.CacheControl)
		h.Set("Content-Type", obj.Metadata["Content-Type"])
		if enc := obj.Metadata["Content-Encoding"]; enc != "" {
			h.Set("Content-Encoding", enc)
		}
		// ServeContent answers If-None-Match against the ETag, and ranges.
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	})
}
