package cdnpusher

import (
	"math/rand/v2"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"roomcast/proto/clientpb"
)

// The cap keeps a uniform sample: over many windows, every position of a lane that does not
// fit is kept about equally often, the first as often as the last.
func TestSampleIsUniform(t *testing.T) {
	t.Parallel()
	const (
		trials   = 4000
		offered  = 100
		capacity = 10
	)
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := make([]*clientpb.Message, offered)
	pos := map[*clientpb.Message]int{}
	for i := range msgs {
		msgs[i] = &clientpb.Message{Id: "m", Lane: clientpb.Lane_LANE_BULK}
		pos[msgs[i]] = i
	}
	var kept [offered]int
	var w window
	for range trials {
		for _, m := range msgs {
			w.add(m, capacity, rng, trace.SpanContext{})
		}
		out, sampled := w.take(capacity, rng)
		if len(out) != capacity || sampled != offered-capacity {
			t.Fatalf("kept %d, sampled %d", len(out), sampled)
		}
		for _, m := range out {
			kept[pos[m]]++
		}
	}
	// Each position is kept with probability 1/10: 400 of 4000, standard deviation 19.
	for i, n := range kept {
		if n < 400-6*19 || n > 400+6*19 {
			t.Fatalf("position %d kept %d times of %d, want about 400: %v", i, n, trials, kept)
		}
	}
}

// Higher lanes are kept first: when the critical lane alone exceeds the cap it is sampled and
// nothing of the lower lanes is kept; when it fits, the next lane gets what is left.
func TestCapKeepsHigherLanesFirst(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		critical, normal, bulk int
		want                   [numClasses]int
	}{
		{critical: 30, normal: 5, bulk: 5, want: [numClasses]int{20, 0, 0}},
		{critical: 5, normal: 30, bulk: 5, want: [numClasses]int{5, 15, 0}},
		{critical: 5, normal: 5, bulk: 30, want: [numClasses]int{5, 5, 10}},
		{critical: 1, normal: 2, bulk: 3, want: [numClasses]int{1, 2, 3}},
	} {
		var w window
		for lane, n := range map[clientpb.Lane]int{clientpb.Lane_LANE_CRITICAL: tc.critical, clientpb.Lane_LANE_NORMAL: tc.normal, clientpb.Lane_LANE_BULK: tc.bulk} {
			for range n {
				w.add(&clientpb.Message{Lane: lane}, 20, rng, trace.SpanContext{})
			}
		}
		out, sampled := w.take(20, rng)
		var got [numClasses]int
		for _, m := range out {
			got[classOf(m.Lane)]++
		}
		total := tc.critical + tc.normal + tc.bulk
		if got != tc.want || sampled != total-len(out) {
			t.Errorf("%+v: kept %v, sampled %d", tc, got, sampled)
		}
	}
}
