package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"roomcast/presence"
)

// configurable lists the commands whose flags a config file and the environment set: every
// command of the usage but the ones without flags of their own (bench has subcommands).
func configurable() []string {
	var cmds []string
	for line := range strings.Lines(usage) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "roomcast" {
			switch f[1] {
			case "bench", "config", "version":
			default:
				cmds = append(cmds, f[1])
			}
		}
	}
	return cmds
}

// configured runs cmd with --check-config and returns its flags as configured, failing the
// test unless that succeeds. The environment is the test's (t.Setenv).
func configured(t *testing.T, cmd string, args ...string) *flag.FlagSet {
	t.Helper()
	var got *flag.FlagSet
	parsedHook = func(fs *flag.FlagSet) { got = fs }
	defer func() { parsedHook = nil }()
	var stderr bytes.Buffer
	if code := run(context.Background(), append([]string{cmd, "--check-config"}, args...), io.Discard, &stderr); code != 0 || got == nil {
		t.Fatalf("roomcast %s %q: exit %d: %s", cmd, args, code, stderr.String())
	}
	return got
}

// testValues are three values of a flag, for the file, the environment and the command line,
// that differ from each other and the file's from the default.
func testValues(f *flag.Flag) [3]string {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		other := fmt.Sprint(f.DefValue != "true")
		return [3]string{other, f.DefValue, other}
	}
	switch kind, _ := flag.UnquoteUsage(f); kind {
	case "int", "int64", "uint", "uint64":
		return [3]string{"11", "22", "33"}
	case "float":
		return [3]string{"1.5", "2.5", "3.5"}
	case "duration":
		return [3]string{"11s", "22s", "33s"}
	case "rate": // the --limit-... rates
		return [3]string{"11/s", "22/s", "33/s"}
	case "value": // the repeatable KEY=VALUE and URL flags
		return [3]string{"k=file", "k=env", "k=argv"}
	}
	return [3]string{"from-file", "from-env", "from-argv"}
}

// TestConfigEveryFlag walks every flag of every command: each can be set from the config file,
// from the environment, and from a file named by a -file key or a _FILE variable, and the
// command line wins over the environment, which wins over the file. Not parallel: it sets
// the environment and parsedHook.
func TestConfigEveryFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cmds := configurable()
	for _, want := range []string{"dev", "chatlink", "services", "cdnpusher"} {
		if !strings.Contains(" "+strings.Join(cmds, " ")+" ", " "+want+" ") {
			t.Fatalf("the usage lists no %q among %q", want, cmds)
		}
	}
	for _, cmd := range cmds {
		var names []*flag.Flag
		configured(t, cmd).VisitAll(func(f *flag.Flag) {
			if f.Name != "config" && f.Name != "check-config" {
				names = append(names, f)
			}
		})
		for _, f := range names {
			t.Run(cmd+"/"+f.Name, func(t *testing.T) {
				v := testValues(f)
				// What each value reads as once set: the command line's reading is the truth.
				read := func(fs *flag.FlagSet) string { return fs.Lookup(f.Name).Value.String() }
				var want [3]string
				for i := range v {
					want[i] = read(configured(t, cmd, "--"+f.Name+"="+v[i]))
				}
				if want[0] == f.DefValue || want[1] == want[0] || want[2] == want[1] {
					t.Fatalf("test values %q read as %q (default %q): give this flag's type values of its own in testValues", v, want, f.DefValue)
				}
				file := write(cmd+".yaml", fmt.Sprintf("%s:\n  %s: %q\n", cmd, f.Name, v[0]))
				env := envName(f.Name)
				if got := read(configured(t, cmd, "--config", file)); got != want[0] {
					t.Errorf("from the file: %q, want %q", got, want[0])
				}
				secret := write(f.Name+".value", v[0]+"\n")
				fileKey := write(cmd+"-file.yaml", fmt.Sprintf("%s:\n  %s-file: %q\n", cmd, f.Name, secret))
				if got := read(configured(t, cmd, "--config", fileKey)); got != want[0] {
					t.Errorf("from the file's %s-file: %q, want %q", f.Name, got, want[0])
				}
				t.Run("env", func(t *testing.T) {
					t.Setenv(env+"_FILE", secret)
					if got := read(configured(t, cmd)); got != want[0] {
						t.Errorf("from $%s_FILE: %q, want %q", env, got, want[0])
					}
				})
				t.Run("env", func(t *testing.T) {
					t.Setenv(env, v[0])
					if got := read(configured(t, cmd)); got != want[0] {
						t.Errorf("from $%s: %q, want %q", env, got, want[0])
					}
				})
				t.Setenv(env, v[1])
				if got := read(configured(t, cmd, "--config", file)); got != want[1] {
					t.Errorf("file %q and $%s=%q: %q, want the environment's %q", v[0], env, v[1], got, want[1])
				}
				if got := read(configured(t, cmd, "--config", file, "--"+f.Name+"="+v[2])); got != want[2] {
					t.Errorf("file, environment and --%s=%q: %q, want the command line's %q", f.Name, v[2], got, want[2])
				}
			})
		}
	}
}

// TestConfigRepeatable: a repeatable flag takes a YAML list in the file, whitespace-separated
// entries in a variable and one entry per line in a _FILE.
func TestConfigRepeatable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("chatlink:\n  secret: [a=1, b=2]\nservices:\n  api-key-file: "+filepath.Join(dir, "keys")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "keys"), []byte("k1=app\n\nk2=app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := configured(t, "chatlink", "--config", file).Lookup("secret").Value.String(); got != "map[a:1 b:2]" {
		t.Errorf("secret from a list: %s", got)
	}
	if got := configured(t, "services", "--config", file).Lookup("api-key").Value.String(); got != "map[k1:app k2:app]" {
		t.Errorf("api-key from a file of lines: %s", got)
	}
	t.Setenv("ROOMCAST_CDN_BASE_URL", "https://a.example/ https://b.example/")
	if got := configured(t, "services").Lookup("cdn-base-url").Value.String(); got != "https://a.example/,https://b.example/" {
		t.Errorf("cdn-base-url from the environment: %s", got)
	}
}

// TestConfigErrors: what is wrong in a file stops the command with one line naming the file,
// line and key; `roomcast config check` says the same with exit 1.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name, file string
		want       []string
	}{
		{"unknown key", "chatlink:\n  nats: nats://x\n  nats-ulr: nats://y\n", []string{`:3: unknown key "nats-ulr" in section "chatlink"`}},
		{"unknown section", "chatlnk:\n  nats: x\n", []string{`section "chatlnk" is not a command`}},
		{"bad value", "services:\n  history-per-room: lots\n", []string{`:2: invalid value "lots" for history-per-room`}},
		{"list for one value", "services:\n  listen: [a, b]\n", []string{`:2: listen takes one value, not a list`}},
		{"duplicate key", "services:\n  listen: a\n  listen: b\n", []string{`:3: key "listen" appears twice`}},
		{"key and its -file", "chatlink:\n  node: a\n  node-file: " + filepath.Join(dir, "missing") + "\n", []string{`:3:`, "no such file"}},
		{"not YAML", "chatlink: [\n", []string{"yaml:"}},
		{"not sections", "- chatlink\n", []string{"want a mapping of sections"}},
		{"config in the file", "services:\n  config: other.yaml\n", []string{`unknown key "config"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{"config", "check", path}, &stdout, &stderr); code != 1 {
				t.Fatalf("config check: exit %d, want 1; stderr %q", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 {
				t.Errorf("want one line, got %q", msg)
			}
			for _, w := range append(c.want, path) {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not name %q", msg, w)
				}
			}
			if strings.HasPrefix(c.file, "chatlink:\n") || strings.HasPrefix(c.file, "services:\n") {
				cmd, _, _ := strings.Cut(c.file, ":")
				stderr.Reset()
				if code := run(context.Background(), []string{cmd, "--config", path, "--check-config"}, io.Discard, &stderr); code != 2 {
					t.Errorf("roomcast %s --config: exit %d, want 2 (%s)", cmd, code, stderr.String())
				}
			}
		})
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("chatlink:\n  nats: nats://a:4222\n  region: no\n  secret: [app=s]\nservices:\ncdnpusher:\n  s3-secure: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"config", "check", good}, &stdout, &stderr); code != 0 {
		t.Fatalf("config check of a good file: exit %d: %s", code, stderr.String())
	}
}

// TestPresenceFlags: --presence-webhook and --device-policy reach the presence config, and a
// policy that is not one names its bad rule.
func TestPresenceFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("services", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	apply := bindPresenceFlags(fs)
	if err := fs.Parse([]string{"--presence-webhook", "demo=https://hooks.example/p", "--device-policy", "demo=max-sessions=2,one-per-device", "--device-policy", "b=one-per-device"}); err != nil {
		t.Fatal(err)
	}
	var c presence.Config
	if err := apply(&c); err != nil {
		t.Fatal(err)
	}
	if c.Webhooks["demo"] != "https://hooks.example/p" || c.Policies["demo"] != (presence.DevicePolicy{MaxSessions: 2, OnePerDevice: true}) || c.Policies["b"] != (presence.DevicePolicy{OnePerDevice: true}) {
		t.Errorf("got webhooks %v policies %+v", c.Webhooks, c.Policies)
	}
	for _, bad := range []string{"demo=max-sessions=0", "demo=max=2", "demo=one-per-device=yes"} {
		fs := flag.NewFlagSet("services", flag.ContinueOnError)
		apply := bindPresenceFlags(fs)
		if err := fs.Parse([]string{"--device-policy", bad}); err != nil {
			t.Fatal(err)
		}
		if err := apply(&presence.Config{}); err == nil || !strings.Contains(err.Error(), "--device-policy") {
			t.Errorf("--device-policy %s: %v, want an error naming the flag", bad, err)
		}
	}
}

// TestConfigDocExamples: every YAML example in docs/configuration.md passes `roomcast config
// check`, so the documented file is one the binary takes.
func TestConfigDocExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	blocks := strings.Split(string(doc), "```yaml\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("docs/configuration.md has no yaml example")
	}
	for i, b := range blocks {
		example, _, _ := strings.Cut(b, "```")
		// The secret files the example names exist on the host it describes; here, empty ones.
		for _, key := range []string{"secret-file: ", "api-key-file: "} {
			if _, rest, ok := strings.Cut(example, key); ok {
				name, _, _ := strings.Cut(rest, " ")
				local := filepath.Join(dir, filepath.Base(name))
				if err := os.WriteFile(local, []byte("demo=x\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				example = strings.Replace(example, key+name, key+local, 1)
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("example%d.yaml", i))
		if err := os.WriteFile(path, []byte(example), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{"config", "check", path}, &stdout, &stderr); code != 0 {
			t.Errorf("example %d: config check exit %d: %s", i, code, stderr.String())
		}
	}
}

// TestAPIKeyScopes checks --api-key's scopes, from the command line and a config file's block
// list, and that an unknown scope stops the command with exit 2.
func TestAPIKeyScopes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("services:\n  api-key:\n    - k1=app:send,read\n    - k2=app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := configured(t, "services", "--config", file).Lookup("api-key").Value.String(); got != "map[k1:app:send,read k2:app]" {
		t.Errorf("api-key with scopes from the file: %s", got)
	}
	if got := configured(t, "services", "--api-key", "k=app:admin").Lookup("api-key").Value.String(); got != "map[k:app:admin]" {
		t.Errorf("api-key with a scope from the command line: %s", got)
	}
	if got := configured(t, "dev", "--api-key", "ro=demo:read").Lookup("api-key").Value.String(); got != "map[ro:demo:read roomcast-dev-key:demo]" {
		t.Errorf("dev's api-key beside the dev key: %s", got)
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"services", "--check-config", "--api-key", "k=app:write"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), `unknown API key scope "write"`) {
		t.Errorf("an unknown scope: exit %d: %s", code, stderr.String())
	}
}
