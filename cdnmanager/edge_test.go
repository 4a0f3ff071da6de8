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
// origin one request for a segment that is there, and while it is not, at most one a second
// (1 or 2 in all when the pusher writes on time).
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
	originHits := map[string][]originHit{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		proxy.ServeHTTP(sw, r)
		mu.Lock()
		originHits[r.URL.Path] = append(originHits[r.URL.Path], originHit{at: time.Now(), code: sw.code})
		mu.Unlock()
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
	// The edge asks the origin for a segment once when it is there, and while it is not, at
	// most once per second (the origin's 404 is cached for 1 s): so 1 or 2 requests when the
	// pusher writes on time, one more for each second it is late (a loaded machine).
	for i := first; i < first+segments; i++ {
		path := "/cdn/" + segment.Key(devcluster.App, room, windowMs, i)
		hits := originHits[path]
		if ok, why := shielded(hits); !ok {
			t.Errorf("segment %d, %d viewers: %s; origin requests: %v", i, viewers, why, hits)
		}
	}
	t.Logf("origin requests per segment for %d viewers: %v", viewers, originHits)
}

// originHit is one request that reached the origin, when it was answered and with what.
type originHit struct {
	at   time.Time
	code int
}

func (h originHit) String() string { return fmt.Sprintf("%d at %s", h.code, h.at.Format("05.000")) }

// shielded says whether an edge's requests to the origin for one segment are those of a
// shield: exactly one 200, last, and 404s no more than one per cached 404's life (1 s, less
// a little for clock and cache granularity) before it.
func shielded(hits []originHit) (bool, string) {
	if len(hits) == 0 {
		return false, "no origin request"
	}
	for k, h := range hits {
		last := k == len(hits)-1
		switch {
		case last && h.code != http.StatusOK:
			return false, "the last answer is not 200"
		case !last && h.code != http.StatusNotFound:
			return false, fmt.Sprintf("answer %d before the last is %d, not 404", k, h.code)
		case k > 0 && h.at.Sub(hits[k-1].at) < 900*time.Millisecond:
			return false, fmt.Sprintf("request %d came %v after the one before: the edge did not collapse them", k, h.at.Sub(hits[k-1].at))
		}
	}
	return true, ""
}

// statusWriter remembers the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// poll fetches a segment until it is there (a 404 is tried again 100 ms later, for 20 s: a
// loaded machine may write a segment seconds late) and checks it decodes.
func poll(client *http.Client, u string, index int64) error {
	deadline := time.Now().Add(20 * time.Second)
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
