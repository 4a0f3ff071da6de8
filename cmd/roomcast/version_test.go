package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "roomcast ") || !strings.Contains(out.String(), "go       "+runtime.Version()) {
		t.Errorf("roomcast version:\n%s", out.String())
	}
	if code := run(t.Context(), []string{"version", "extra"}, &out, &errOut); code != 2 {
		t.Errorf("roomcast version extra: exit %d, want 2", code)
	}
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T18:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"},
	}}
	want := "roomcast v1.2.3\ncommit   abc123 2026-12-01T18:00:00Z (modified)\ngo       go1.26.8 linux/amd64\n"
	if got := versionText(info); got != want {
		t.Errorf("versionText:\n%s\nwant\n%s", got, want)
	}
}
