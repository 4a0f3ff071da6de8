package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"roomcast/internal/ratelimit"
	"roomcast/proto/clientpb"
	"roomcast/store/applimits"
)

// The call rate of each API key: a key over it is answered 122 (API_RATE_LIMITED) with how
// long to wait, HTTP 429 with Retry-After, or gRPC RESOURCE_EXHAUSTED with a RetryInfo.

// CallLimits bound the server API's calls. A zero field means DefaultCallLimits';
// ratelimit.Unlimited limits nothing.
type CallLimits struct {
	// PerKey bounds the calls of one API key on this instance.
	PerKey ratelimit.Limit
}

// DefaultCallLimits returns the deployment's limits of the server API's calls, what a zero
// CallLimits field means and the default of `roomcast services`' --limit-api-calls-per-key:
// 5,000 calls a second per key, in bursts of 10,000, an app server's traffic, not a loop's.
func DefaultCallLimits() CallLimits {
	return CallLimits{PerKey: ratelimit.Limit{Rate: 5000, Burst: 10000}}
}

// withDefaults returns l with each zero field set to DefaultCallLimits'.
func (l CallLimits) withDefaults() CallLimits {
	if l.PerKey == (ratelimit.Limit{}) {
		l.PerKey = DefaultCallLimits().PerKey
	}
	return l
}

// callLimiter holds each key's bucket.
type callLimiter struct {
	cfg     CallLimits
	now     func() time.Time
	keys    *ratelimit.Table[string]
	limited prometheus.Counter
}

// newCallLimiter returns the limiter; reg (may be nil) receives roomcast_api_limited_total.
func newCallLimiter(cfg CallLimits, reg prometheus.Registerer) *callLimiter {
	l := &callLimiter{
		cfg: cfg, now: time.Now, keys: ratelimit.NewTable[string](4096),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roomcast_api_limited_total", Help: "Server API calls refused by a limit, by limit.",
			ConstLabels: prometheus.Labels{"limit": "calls_key"},
		}),
	}
	if reg != nil {
		reg.MustRegister(l.limited)
	}
	return l
}

// take spends one call of the key in authorization (already checked) of app, or says how long
// until the key may call again. The app's own rate (SetAppLimits) replaces the deployment's.
func (a *API) takeCall(ctx context.Context, app, authorization string) (bool, time.Duration) {
	l := a.calls
	if l == nil { // an API not made by New (tests of the routes and scopes alone)
		return true, 0
	}
	key, _ := strings.CutPrefix(authorization, "Bearer ")
	limit := l.cfg.PerKey
	if own := a.appLimits.App(ctx, app); own != nil {
		limit = applimits.Or(own.APICallsPerKey, limit)
	}
	ok, retry := l.keys.Take(key, limit, l.now())
	if !ok {
		l.limited.Inc()
	}
	return ok, retry
}

// limitHTTP answers a call over its key's rate with 429 and reports false.
func (a *API) limitHTTP(w http.ResponseWriter, r *http.Request, app string) bool {
	ok, retry := a.takeCall(r.Context(), app, r.Header.Get("Authorization"))
	if ok {
		return true
	}
	code := clientpb.ErrorCode_ERROR_CODE_API_RATE_LIMITED
	w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	writeJSON(w, http.StatusTooManyRequests, ErrorBody{
		Code: uint32(code), Name: codeName(code), Error: "over the API key's call rate",
		RetryAfterMS: ratelimit.Millis(retry),
	})
	return false
}

// limitGRPC is the gRPC interceptor, after authenticate, that holds each key to its rate.
func (a *API) limitGRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	app := appOf(ctx)
	if app == "" {
		return h(ctx, req) // not an API call: authenticate let it through for its own service
	}
	ok, retry := a.takeCall(ctx, app, mdFirst(ctx, "authorization"))
	if ok {
		return h(ctx, req)
	}
	code := clientpb.ErrorCode_ERROR_CODE_API_RATE_LIMITED
	st := status.New(grpcCode(code), "over the API key's call rate")
	if d, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: codeName(code), Domain: "roomcast", Metadata: map[string]string{"code": strconv.Itoa(int(code))}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)},
	); err == nil {
		st = d
	}
	return nil, st.Err()
}
