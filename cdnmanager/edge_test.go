package cdnmanager_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"roomcast/cdnpusher/segment"
	"roomcast/internal/devcluster"
	"roomcast/internal/testkit"
)

// nginxConf is a CDN edge: a cache in front of the origin where concurrent misses of one
// object wait for the first one's answer (proxy_cache_lock), and where, once the origin's
// one-second 404 for a segment not written yet has expired, one request asks the origin again
// while the others get the 404 a little longer (proxy_cache_use_stale updating): the request
// collapsing a CDN's shield does.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path {dir}/body;
	proxy_temp_path {dir}/proxy;
	fastcgi_temp_path {dir}/fastcgi;
	uwsgi_temp_path {dir}/uwsgi;
	scgi_temp_path {dir}/scgi;
	proxy_cache_path {dir}/cache keys_zone=segments:10m;
	server {
		listen {listen};
		location / {
			proxy_pass {origin};
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_cache segments;
			proxy_cache_lock on;
			proxy_cache_lock_timeout 5s;
			proxy_cache_use_stale updating;
		}
	}
}
`

// startNginx runs Debian's nginx as a subprocess in front of origin and returns its base URL.
// The test fails, not skips, without nginx: `make tools` installs it.
func startNginx(t *testing.T, origin string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Fatalf("nginx not found (make tools installs Debian's nginx-light): %v", err)
		}
		bin = "/usr/sbin/nginx"
	}
	dir := t.TempDir()
	listen := testkit.FreeAddr(t)
	conf := strings.NewReplacer("{dir}", dir, "{listen}", listen, "{origin}", origin).Replace(nginxConf)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error log:\n%.3000s", b)
		}
	})
	base := "http://" + listen
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get(base + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	return base
}

// Through a real CDN edge (nginx with proxy_cache_lock), 1,000 viewers polling one room's
// segments as clients do (at the next segment's time plus jitter, again after a 404) cost the
// origin at most 2 requests per segment.
func TestEdgeShieldsOrigin(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	const room = "arena"
	api(t, c, "PUT", "/v1/rooms/"+room+"/cdn", map[string]any{"mode": "CDN_MODE_BULK"}, nil)
	waitMode(t, c, room, "CDN_MODE_BULK")
	snd := startSender(t, c, room, 20*time.Millisecond, false)

	// The origin, counting the requests that reach it.
	target, _ := url.Parse(c.URL())
	var mu sync.Mutex
	originHits := map[string]int{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		originHits[r.URL.Path]++
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(origin.Close)
	edge := startNginx(t, origin.URL)

	const viewers, segments = 1000, 3
	const windowMs, graceMs = 1000, 100
	first := nowIndex() + 1
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: viewers}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	var wg sync.WaitGroup
	errs := make(chan error, viewers)
	for v := range viewers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(v), 1))
			for i := first; i < first+segments; i++ {
				// A client polls segment i at its next_at_ms (the end of its window plus the
				// pusher's grace), plus its jitter.
				at := time.UnixMilli((i+1)*windowMs + graceMs).Add(time.Duration(rng.IntN(200)) * time.Millisecond)
				time.Sleep(time.Until(at))
				if err := poll(client, edge+"/cdn/"+segment.Key(devcluster.App, room, windowMs, i), i); err != nil {
					errs <- fmt.Errorf("viewer %d: %w", v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	snd.halt()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := first; i < first+segments; i++ {
		path := "/cdn/" + segment.Key(devcluster.App, room, windowMs, i)
		if n := originHits[path]; n < 1 || n > 2 {
			t.Errorf("segment %d: %d origin requests for %d viewers, want 1 or 2", i, n, viewers)
		}
	}
	t.Logf("origin requests per segment for %d viewers: %v", viewers, originHits)
}

// poll fetches a segment until it is there (a 404 is tried again 100 ms later, for 5 s) and
// checks it decodes.
func poll(client *http.Client, u string, index int64) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := client.Get(u)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return err
		case resp.StatusCode == http.StatusOK:
			_, err := segment.Decode(body, segment.Want{App: devcluster.App, Room: "arena", WindowMs: 1000, Index: index})
			return err
		case resp.StatusCode != http.StatusNotFound || time.Now().After(deadline):
			return fmt.Errorf("%s: HTTP %d", u, resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
