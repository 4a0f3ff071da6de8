// Package s3test runs a real S3 server for tests: versitygw over a temporary directory, as a
// subprocess on a loopback port, with one bucket. It is test plumbing only; nothing outside
// tests may import it.
package s3test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"roomcast/internal/testkit"
)

// Credentials of the server's root account.
const (
	AccessKey = "roomcast-test"
	SecretKey = "roomcast-test-secret"
	Bucket    = "segments"
)

// Server is a running versitygw. Stop and Start may be called to take it down and bring it
// back on the same port and directory; the test's cleanup stops it for good.
type Server struct {
	// Endpoint is host:port, for minio.New.
	Endpoint string
	// Dir holds the buckets: Dir/Bucket/key is an object's file.
	Dir string

	t   testing.TB
	bin string
	log string

	// transport serves every client of this server; DisableCompression keeps bodies as stored.
	transport *http.Transport

	mu     sync.Mutex // guards cmd and exited
	cmd    *exec.Cmd  // nil while stopped
	exited chan struct{}
}

// Binary finds versitygw: on PATH, else where `go install` puts it. The error says how to get it.
func Binary() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("GOPATH"); d != "" {
		dirs = append(dirs, filepath.Join(filepath.SplitList(d)[0], "bin"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("versitygw not found on PATH nor in %v: `make test` installs it (make tools)", dirs)
}

// Start runs versitygw on a free loopback port over a new temporary directory, waits until it
// answers, creates Bucket and returns. The test fails (it does not skip) if versitygw is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &Server{
		Endpoint: testkit.FreeAddr(t), Dir: filepath.Join(dir, "data"), t: t, bin: bin, log: filepath.Join(dir, "versitygw.log"),
		transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16},
	}
	if err := os.Mkdir(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		s.transport.CloseIdleConnections()
	})
	s.Restart()
	if err := s.Client().MakeBucket(context.Background(), Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("s3test: create bucket: %v", err)
	}
	return s
}

// Client is a minio client for the server, making one attempt per call.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), MaxRetries: 1, Transport: s.transport,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// Restart starts the server again (or the first time) on the same port and directory and waits
// until it answers requests.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatal("s3test: Restart while running")
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--port", s.Endpoint, "--quiet", "posix", s.Dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("s3test: start %s: %v", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			s.cmd = nil
			s.t.Fatalf("s3test: versitygw exited at start: %v\n%s", cmd.ProcessState, s.logTail())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.Client().ListBuckets(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("s3test: versitygw not ready after 15s: %v\n%s", err, s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: an outage, not a shutdown) and waits until it has exited.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
	s.transport.CloseIdleConnections()
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatal("s3test: server not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

// Get fetches an object the way a CDN edge or a browser would: a plain (presigned) HTTP GET
// that asks for no compression, so the body is exactly the stored bytes. It returns the
// response; a missing object is a 404, not an error.
func (s *Server) Get(key string) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := s.Client().PresignedGetObject(ctx, Bucket, key, time.Minute, nil)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := (&http.Client{Transport: s.transport}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
