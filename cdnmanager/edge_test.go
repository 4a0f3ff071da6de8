package cdnmanager_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/tools/cdnedge"
	"roomcast/proto/segment"
)

// startNginx runs a CDN edge (internal/tools/cdnedge: Debian's nginx with proxy_cache_lock) in
// front of origin and returns its base URL. The test fails, not skips, without nginx: `make tools`
// installs it.
func startNginx(t *testing.T, origin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := cdnedge.Start(ctx, cdnedge.Config{Origin: strings.TrimPrefix(origin, "http://"), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		if t.Failed() {
			t.Logf("nginx error log:\n%s", e.ErrorLog())
		}
	})
	return e.URL
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
