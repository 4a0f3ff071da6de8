package api_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
)

// BenchmarkSendToRoomHTTP measures a message's way in: POST /v1/rooms/{room}/messages through
// the server API, the room service, the broadcast on NATS and the JetStream history, one request
// at a time on a kept-alive connection, to a room with no members (no fan-out). cpu-ns/op is the
// whole process's CPU per message (RUSAGE_SELF), the HTTP client's included. A critical send is
// answered once its batch window is published (20 ms by default), a normal one on acceptance:
// the normal sub-benchmark sends back to back, so that the process's idle CPU over the windows
// does not dilute the figure.
func BenchmarkSendToRoomHTTP(b *testing.B) {
	for _, lane := range []string{"critical", "normal"} {
		b.Run(lane, func(b *testing.B) { benchmarkSendToRoomHTTP(b, lane) })
	}
}

func benchmarkSendToRoomHTTP(b *testing.B, lane string) {
	c := testcluster.Start(b, testcluster.ChatLinks(1))
	hc := &http.Client{Timeout: 10 * time.Second}
	post := func(path, body string, want int) {
		req, err := http.NewRequest(http.MethodPost, c.URL()+path, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("POST %s: HTTP %d, want %d", path, resp.StatusCode, want)
		}
	}
	post("/v1/rooms", `{"room":"bench"}`, http.StatusCreated)
	before := testkit.ProcessCPU()
	b.ResetTimer()
	for range b.N {
		post("/v1/rooms/bench/messages", `{"body":"hello","lane":"`+lane+`"}`, http.StatusOK)
	}
	b.StopTimer()
	b.ReportMetric(float64((testkit.ProcessCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
