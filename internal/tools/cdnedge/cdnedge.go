// Package cdnedge runs a real CDN edge in front of a segment origin: Debian's nginx as a
// subprocess, with a cache where concurrent misses of one object wait for the first one's
// answer (proxy_cache_lock), as a CDN's shield does. The CDN tests and `roomcast bench cdn` use
// it; no server role may, and it must not configure anything a production CDN would not do.
package cdnedge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// conf is the edge's nginx.conf. Once the origin's one-second 404 for a segment not written yet
// has expired, one request asks the origin again while the others get the 404 a little longer
// (proxy_cache_use_stale updating): the request collapsing of a CDN's shield.
const conf = `daemon off;
{user}master_process {master};
worker_processes {workers};
worker_rlimit_nofile {nofile};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events { worker_connections {connections}; }
http {
	access_log off;
	sendfile on;
	tcp_nopush on;
	keepalive_requests 1000000;
	client_body_temp_path {dir}/body;
	proxy_temp_path {dir}/proxy;
	fastcgi_temp_path {dir}/fastcgi;
	uwsgi_temp_path {dir}/uwsgi;
	scgi_temp_path {dir}/scgi;
	proxy_cache_path {dir}/cache keys_zone=segments:10m;
	upstream origin {
		server {origin};
		keepalive 32;
	}
	server {
		listen {listen} backlog=4096;
		location / {
			proxy_pass http://origin;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host {origin};
			proxy_cache segments;
			proxy_cache_lock on;
			proxy_cache_lock_timeout 5s;
			proxy_cache_use_stale updating;
		}
	}
}
`

// Config says where the edge listens and what it fronts.
type Config struct {
	// Origin is the origin's host:port (plain HTTP). Required.
	Origin string
	// Dir holds nginx's configuration, cache and error log. Required.
	Dir string
	// Listen is the edge's host:port. Zero value means a free loopback port.
	Listen string
	// Workers is how many nginx worker processes serve. Zero value means 1, in nginx's own
	// process.
	Workers int
	// WorkerConnections bounds each worker's connections, clients' and the origin's. Zero
	// value means 4096.
	WorkerConnections int
}

// Edge is a running nginx.
type Edge struct {
	// URL is the edge's base URL, e.g. "http://127.0.0.1:34567".
	URL  string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when nginx has exited
}

// Binary finds nginx: on PATH, else /usr/sbin/nginx. The error says how to get it.
func Binary() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("cdnedge: nginx not found (make tools installs Debian's nginx-light)")
}

// Start runs nginx with cfg and returns once it answers, or ctx ends.
func Start(ctx context.Context, cfg Config) (*Edge, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if cfg.Origin == "" || cfg.Dir == "" {
		return nil, errors.New("cdnedge: Config.Origin and Config.Dir are required")
	}
	if cfg.Listen == "" {
		if cfg.Listen, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	master, workers := "off", 1
	if cfg.Workers > 1 {
		master, workers = "on", cfg.Workers
	}
	if cfg.WorkerConnections <= 0 {
		cfg.WorkerConnections = 4096
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;\n" // else root's workers run as nobody, who may not write to Dir
	}
	text := strings.NewReplacer(
		"{user}", user, "{dir}", cfg.Dir, "{listen}", cfg.Listen, "{origin}", cfg.Origin, "{master}", master,
		"{workers}", strconv.Itoa(workers), "{connections}", strconv.Itoa(cfg.WorkerConnections),
		"{nofile}", strconv.Itoa(2*cfg.WorkerConnections+64),
	).Replace(conf)
	path := filepath.Join(cfg.Dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return nil, fmt.Errorf("cdnedge: %w", err)
	}
	e := &Edge{URL: "http://" + cfg.Listen, dir: cfg.Dir, done: make(chan struct{})}
	e.cmd = exec.Command(bin, "-p", cfg.Dir, "-c", path, "-e", filepath.Join(cfg.Dir, "error.log"))
	e.cmd.Stderr = os.Stderr
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cdnedge: %w", err)
	}
	go func() {
		_ = e.cmd.Wait()
		close(e.done)
	}()
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	for {
		resp, err := probe.Get(e.URL + "/")
		if err == nil {
			resp.Body.Close()
			return e, nil
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("cdnedge: nginx exited: %s", e.ErrorLog())
		case <-ctx.Done():
			e.Close()
			return nil, fmt.Errorf("cdnedge: nginx did not answer: %w (%s)", ctx.Err(), e.ErrorLog())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops nginx (SIGTERM, its fast shutdown, which ends its workers too; SIGKILL after 5 s)
// and waits until it has exited. It may be called more than once.
func (e *Edge) Close() {
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
}

// ErrorLog returns the end of nginx's error log.
func (e *Edge) ErrorLog() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "error.log"))
	return string(b[max(0, len(b)-3000):])
}

// freeAddr returns a loopback address no one listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cdnedge: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
