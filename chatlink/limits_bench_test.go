package chatlink

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"roomcast/internal/ratelimit"
	"roomcast/internal/testkit"
)

// BenchmarkSendLimitCheck measures what the send limits add to each client Send: the
// connection's, the user's and the room's buckets, all on and never tripping, from parallel
// senders (distinct connections and users, 16 rooms). cpu-ns/op is the process's CPU per check.
func BenchmarkSendLimitCheck(b *testing.B) {
	huge := ratelimit.Limit{Rate: 1e9, Burst: 1e9}
	l, err := newLimiter(Config{Limits: Limits{SendsPerConn: huge, SendsPerUser: huge, SendsPerRoom: huge}})
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	before := testkit.ProcessCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(1)
		c := &conn{sends: new(connSends), app: "demo", uid: "u" + strconv.FormatInt(i, 10), room: "r" + strconv.FormatInt(i%16, 10)}
		now := time.Now()
		for pb.Next() {
			if limit, _ := l.send(c, now); limit != "" {
				b.Fatal("limited under a huge limit")
			}
		}
	})
	b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
