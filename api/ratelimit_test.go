package api_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"roomcast/internal/auth"
	"roomcast/internal/ratelimit"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
)

// TestCallRatePerKey: calls under a key's rate pass; the first over it is refused over HTTP
// with 429, Retry-After and retry_after_ms, and over gRPC with RESOURCE_EXHAUSTED and a
// RetryInfo; another key is not held; the refusals are counted.
func TestCallRatePerKey(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, func(cfg *devcluster.Config) {
		cfg.API.Keys = auth.APIKeys{devcluster.APIKey: {App: devcluster.App}, "other-key": {App: "other"}}
		cfg.API.Limits.PerKey = ratelimit.Limit{Rate: 0.5, Burst: 3} // a token every 2 s
	})
	for i := range 3 {
		if status, out := httpCall(t, c, "GET", "/v1/online", devcluster.APIKey, ""); status != 200 {
			t.Fatalf("call %d of a burst of 3: HTTP %d %v", i+1, status, out)
		}
	}
	req, _ := http.NewRequest("GET", c.URL()+"/v1/online", nil)
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("fourth call: HTTP %d Retry-After %q %s; want 429 with Retry-After 2", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	m := regexp.MustCompile(`"code":122,.*"retry_after_ms":(\d+)`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("fourth call: body %s lacks code 122 and retry_after_ms", body)
	}
	if ms, _ := strconv.Atoi(string(m[1])); ms < 1000 || ms > 2000 {
		t.Fatalf("retry_after_ms %d, want 1000..2000 at 0.5/s", ms)
	}
	if status, out := httpCall(t, c, "GET", "/v1/online", "other-key", ""); status != 200 {
		t.Fatalf("another key: HTTP %d %v", status, out)
	}

	g := grpcClient(t, c)
	_, err = g.CountOnline(devCtx(), &apipb.CountOnlineRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("gRPC call over the rate: %v, want RESOURCE_EXHAUSTED", err)
	}
	var retry time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri.RetryDelay.AsDuration()
		}
	}
	if retry <= 0 || retry > 2*time.Second {
		t.Fatalf("gRPC RetryInfo %v, want up to 2s", retry)
	}
	if n := testkit.MetricValue(t, c.URL()+"/metrics", `roomcast_api_limited_total{limit="calls_key"}`); n != 2 {
		t.Fatalf("roomcast_api_limited_total = %d, want 2", n)
	}
}

// TestAppLimitsThroughTheAPI: SetAppLimits checks what it stores, GetAppLimits returns it, and
// the app's own call rate replaces the deployment's within about a second.
func TestAppLimitsThroughTheAPI(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	if status, out := httpCall(t, c, "PUT", "/v1/limits", devcluster.APIKey, `{"sends_per_conn": "fast"}`); status != 400 {
		t.Fatalf("a rate that does not parse: HTTP %d %v, want 400", status, out)
	}
	if status, out := httpCall(t, c, "PUT", "/v1/limits", devcluster.APIKey, `{"deny": ["10.0.0.0/33"]}`); status != 400 {
		t.Fatalf("a CIDR that does not parse: HTTP %d %v, want 400", status, out)
	}
	mustHTTP(t, c, 200, "PUT", "/v1/limits", `{"api_calls_per_key": "1/m:2", "deny": ["198.51.100.0/24"]}`)
	got := mustHTTP(t, c, 200, "GET", "/v1/limits", "")
	if got["api_calls_per_key"] != "1/m:2" || len(got["deny"].([]any)) != 1 {
		t.Fatalf("GET /v1/limits: %v", got)
	}
	start := time.Now()
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if status, out := httpCall(t, c, "GET", "/v1/online", devcluster.APIKey, ""); status != http.StatusTooManyRequests {
			return fmt.Errorf("call after the change: HTTP %d %v", status, out)
		}
		return nil
	})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the app's call rate took %v to apply", d)
	}
	// gRPC sees the same limits.
	l, err := grpcClient(t, c).GetAppLimits(devCtx(), &apipb.GetAppLimitsRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("GetAppLimits over the app's rate: %v %v, want RESOURCE_EXHAUSTED", l, err)
	}
}
