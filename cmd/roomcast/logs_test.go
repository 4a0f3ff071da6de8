package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// -v logs debug records, --log-format chooses text or JSON (and refuses anything else), every
// record names the role, and --audit-log gets the audit records only, whatever -v says.
func TestLogFlags(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) *logFlags {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f := bindLogFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return f
	}
	auditFile := filepath.Join(t.TempDir(), "audit.log")
	var out bytes.Buffer
	log, audit, closeAudit, err := parse("-v", "--log-format", "json", "--audit-log", auditFile).loggers(&out, "chatlink")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("detail", "room", "r1")
	audit.Info("login refused", "audit", true)
	closeAudit()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("stderr has %d records, want 2:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["role"] != "chatlink" {
			t.Errorf("record %q (%v), want JSON naming the role", l, err)
		}
	}
	if !strings.Contains(lines[0], `"level":"DEBUG"`) {
		t.Errorf("-v: %s, want a debug record", lines[0])
	}
	b, _ := os.ReadFile(auditFile)
	if got := strings.TrimSpace(string(b)); !strings.Contains(got, `"msg":"login refused"`) || strings.Contains(got, "detail") {
		t.Errorf("--audit-log has %q, want the audit record only", got)
	}

	out.Reset()
	log, _, _, err = parse().loggers(&out, "services")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("shown", "app", "demo")
	if got := out.String(); !strings.HasPrefix(got, "time=") || !strings.Contains(got, "msg=shown role=services app=demo") || strings.Contains(got, "hidden") {
		t.Errorf("default text logs: %q", got)
	}
	if _, _, _, err := parse("--log-format", "xml").loggers(io.Discard, "dev"); err == nil || !strings.Contains(err.Error(), "want text or json") {
		t.Errorf("--log-format xml: %v", err)
	}
	if _, _, _, err := parse("--audit-log", filepath.Join(t.TempDir(), "no", "such", "dir")).loggers(io.Discard, "dev"); err == nil || !strings.Contains(err.Error(), "--audit-log") {
		t.Errorf("--audit-log in a missing directory: %v", err)
	}
	for _, args := range [][]string{{"--otlp-endpoint", "collector:4318"}, {"--otlp-endpoint", "http://collector:4318", "--trace-sample-ratio", "2"}} {
		if _, _, _, err := parse(args...).loggers(io.Discard, "dev"); err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("%v: %v, want a refusal naming --otlp-endpoint", args, err)
		}
	}
}

// Every role takes the logging flags.
func TestRolesTakeLogFlags(t *testing.T) {
	t.Parallel()
	for _, role := range []string{"dev", "chatlink", "services", "cdnpusher"} {
		var out, errOut bytes.Buffer
		run(t.Context(), []string{role, "--help"}, &out, &errOut)
		for _, f := range []string{"  -v\tlog at debug level", "-log-format string", "-audit-log string", "-otlp-endpoint string", "-trace-sample-ratio float"} {
			if !strings.Contains(errOut.String(), f) {
				t.Errorf("roomcast %s --help has no %q", role, f)
			}
		}
	}
}
