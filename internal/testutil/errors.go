package testutil

import (
	"strings"
	"testing"
)

// WantError fails t now unless err matches want: no error when want is empty, otherwise an
// error whose text contains want.
func WantError(t testing.TB, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one saying %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q, want one saying %q", err, want)
	}
}
