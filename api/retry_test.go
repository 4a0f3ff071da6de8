package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/bus"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
)

// TestReadRetriedAfterLostRequest: a room-service instance takes a GetRoom from the queue group
// and dies without answering (a subscriber in the room service's queue group that takes one
// request, never answers and leaves). The API asks once more, the live instance answers, and
// the call succeeds; the retry is counted.
func TestReadRetriedAfterLostRequest(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	mustHTTP(t, c, http.StatusCreated, http.MethodPost, "/v1/rooms", `{"room":"lost"}`)

	nc := testkit.Connect(t, c.NATS)
	taken := make(chan struct{})
	var dead *nats.Subscription
	dead, err := nc.QueueSubscribe(bus.SubjectRoomInfo, "room", func(*nats.Msg) {
		_ = dead.Unsubscribe() // killed with the request in hand
		close(taken)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The queue group picks at random: ask until the dead instance took one.
	for i := 0; ; i++ {
		if i == 64 {
			t.Fatal("the dead instance never took a request")
		}
		start := time.Now()
		if status, out := httpCall(t, c, http.MethodGet, "/v1/rooms/lost", devcluster.APIKey, ""); status != http.StatusOK {
			t.Fatalf("GET room, call %d: HTTP %d %v after %v", i, status, out, time.Since(start))
		}
		select {
		case <-taken:
		default:
			continue
		}
		break
	}
	series := `roomcast_api_bus_read_retries_total{subject="` + bus.SubjectRoomInfo + `"}`
	if got := testkit.MetricValue(t, c.URL()+"/metrics", series); got != 1 {
		t.Errorf("%s = %d, want 1", series, got)
	}
}
