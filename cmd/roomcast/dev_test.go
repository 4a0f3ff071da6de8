package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDevNodeLabel: --node-label reads NODE=REGION[:ISP] and refuses anything else with exit 2
// and the form it wants.
func TestDevNodeLabel(t *testing.T) {
	t.Parallel()
	l := nodeLabels{}
	for _, v := range []string{"cl-1=AS/CN/22:China Unicom", "cl-2=EU"} {
		if err := l.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	if got, want := l.String(), "cl-1=AS/CN/22:China Unicom,cl-2=EU"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, bad := range []string{"cl-1", "=EU", "cl-1=", "cl-1=:unicom"} {
		var errOut bytes.Buffer
		if code := run(t.Context(), []string{"dev", "--node-label", bad}, &bytes.Buffer{}, &errOut); code != 2 ||
			!strings.Contains(errOut.String(), "want NODE=REGION[:ISP]") {
			t.Errorf("--node-label %q: exit %d, %q; want 2 naming the form", bad, code, errOut.String())
		}
	}
}
