package bus

import (
	"strings"
	"testing"
)

func TestTraceID(t *testing.T) {
	t.Parallel()
	const trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, c := range []struct {
		tp, want string
	}{
		{"00-" + trace + "-" + span + "-01", trace},
		{"00-" + trace + "-" + span + "-00", trace},
		{"01-" + trace + "-" + span + "-01", ""},                    // a version we do not read
		{"00-" + strings.ToUpper(trace) + "-" + span + "-01", ""},   // upper case
		{"00-00000000000000000000000000000000-" + span + "-01", ""}, // zero trace id
		{"00-" + trace + "-0000000000000000-01", ""},                // zero parent id
		{"00-" + trace[1:] + "-" + span + "-01", ""},                // short
		{"00-" + trace + "-" + span + "-01-extra", ""},
		{"00-" + trace + "-" + span + "0-1", ""}, // the right length, a dash misplaced
		{"00-" + trace + "-" + span + "-0g", ""}, // flags not hex
		{"00-" + trace + "x" + span + "-01", ""}, // no dash between the ids
		{"", ""},
	} {
		got, ok := TraceID(c.tp)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("TraceID(%q) = %q, %v; want %q", c.tp, got, ok, c.want)
		}
	}
	child := ChildTraceparent("00-" + trace + "-" + span + "-01")
	if got, _ := TraceID(child); got != trace || strings.Contains(child, span) || !strings.HasSuffix(child, "-01") {
		t.Errorf("child of the span: %q, want the trace with a new parent id and the flags", child)
	}
	fresh := ChildTraceparent("garbage")
	if got, ok := TraceID(fresh); !ok || got == trace {
		t.Errorf("child of garbage: %q, want a new well-formed trace", fresh)
	}
}

func FuzzTraceID(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00--")
	f.Fuzz(func(t *testing.T, tp string) {
		if trace, ok := TraceID(tp); ok {
			if len(trace) != 32 || !strings.Contains(tp, trace) {
				t.Fatalf("TraceID(%q) = %q", tp, trace)
			}
			if got, ok := TraceID(ChildTraceparent(tp)); !ok || got != trace {
				t.Fatalf("child of %q lost the trace: %q", tp, got)
			}
		}
	})
}
