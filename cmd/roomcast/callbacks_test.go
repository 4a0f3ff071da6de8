package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCallbacksFlag: services and dev read --callbacks before starting anything, and stop with
// the file's fault.
func TestCallbacksFlag(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "callbacks.json")
	if err := os.WriteFile(bad, []byte(`{"apps":{"demo":{"login_url":"http://127.0.0.1:1/login"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"services", "--api-key", "k=demo", "--callbacks", bad},
		{"dev", "--data", t.TempDir(), "--callbacks", bad},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "secret_file or secret_env is required") {
			t.Errorf("%s: exit %d, %q: want 2 and the file's fault", args[0], code, errOut.String())
		}
		errOut.Reset()
		run(context.Background(), []string{args[0], "--help"}, &out, &errOut)
		if !strings.Contains(errOut.String(), "-callbacks") {
			t.Errorf("%s --help does not document --callbacks", args[0])
		}
	}
}
