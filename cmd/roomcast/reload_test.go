package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/roles/devnats"
	"roomcast/internal/testkit"
)

// reloads returns the value of roomcast_config_reloads_total{result} on an ops endpoint, -1 when
// the endpoint does not answer.
func reloads(t *testing.T, ops, result string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + ops + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	prefix := `roomcast_config_reloads_total{result="` + result + `"} `
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// writeFile replaces the file at once (a new file renamed over it), as an operator should: a
// reload never reads it half written.
func writeFile(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestReloadKeysAndSecrets rotates an API key and a token secret of running services and a
// running ChatLink, both read from files named in the config file, while API calls and logins
// go on. The key is rotated the usual way: a file with both keys (taken up on SIGHUP), the
// callers move to the new key, a file with only the new one (taken up when the file changes,
// no signal); no call fails, then the old key is refused and the new one works. The secret is
// replaced on SIGHUP: logins before and after it succeed (each with a token of the secret in
// force), a token of the old secret is refused after it, and a connection logged in before it
// stays. A file that does not parse keeps the keys in force and is counted.
func TestReloadKeysAndSecrets(t *testing.T) {
	t.Parallel()
	ns, err := devnats.Start(devnats.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	dir := t.TempDir()
	keysFile, secretsFile, config := filepath.Join(dir, "api-keys"), filepath.Join(dir, "secrets"), filepath.Join(dir, "roomcast.yaml")
	const oldSecret, newSecret = "old-secret-0123456789abcdef", "new-secret-fedcba9876543210"
	writeFile(t, keysFile, "k1=demo\n")
	writeFile(t, secretsFile, "demo="+oldSecret+"\n")
	writeFile(t, config, fmt.Sprintf("services:\n  api-key-file: %s\nchatlink:\n  secret-file: %s\n", keysFile, secretsFile))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api, svcOps, ws, clOps := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	var svcOut, clOut syncBuffer
	done := make(chan int, 2)
	go func() {
		done <- run(ctx, []string{"services", "--config", config, "--nats", ns.ClientURL(), "--listen", api, "--grpc-listen", "127.0.0.1:0", "--ops", svcOps}, &svcOut, &svcOut)
	}()
	go func() {
		done <- run(ctx, []string{"chatlink", "--config", config, "--nats", ns.ClientURL(), "--node", "edge-r", "--ws", ws, "--tcp", "127.0.0.1:0", "--ops", clOps}, &clOut, &clOut)
	}()
	defer func() { cancel(); <-done; <-done }()

	call := func(key string) (int, error) {
		req, _ := http.NewRequest("GET", "http://"+api+"/v1/users/u1/sessions", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	url := "ws://" + ws + "/v1/ws"
	token := func(secret string) string {
		tok, err := auth.Mint([]byte(secret), "demo", "u1", "r1", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	testkit.CheckFor(t, 45*time.Second, 50*time.Millisecond, func() error {
		select {
		case code := <-done:
			t.Fatalf("a role exited %d:\nservices:\n%s\nchatlink:\n%s", code, svcOut.String(), clOut.String())
		default:
		}
		if code, err := call("k1"); err != nil || code != 200 {
			return fmt.Errorf("API: %d %v", code, err)
		}
		if reloads(t, clOps, "ok") < 0 {
			return errors.New("chatlink not up")
		}
		return nil
	})
	before := testkit.DialWS(t, url)
	defer before.Close()
	before.Login(token(oldSecret))

	// Callers that never stop: API calls with the key they are given, logins with a token of
	// the secret in force (the rotation holds loginMu while the secret changes).
	var (
		key      atomic.Value
		secret   atomic.Value
		loginMu  sync.RWMutex
		calls    atomic.Int64
		logins   atomic.Int64
		failures = make(chan string, 100)
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	key.Store("k1")
	secret.Store(oldSecret)
	fail := func(s string) {
		select {
		case failures <- s:
		default:
		}
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := key.Load().(string)
			if code, err := call(k); err != nil || code != 200 {
				fail(fmt.Sprintf("API call with %s: %d %v", k, code, err))
			}
			calls.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			loginMu.RLock()
			c := testkit.DialWS(t, url)
			if f := c.LoginAs(token(secret.Load().(string)), "test"); f.GetLoginAck() == nil {
				fail(fmt.Sprintf("login: %v", f))
			}
			c.Close()
			loginMu.RUnlock()
			logins.Add(1)
		}
	}()
	waitReload := func(ops, result string, from float64) {
		t.Helper()
		testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			if got := reloads(t, ops, result); got <= from {
				return fmt.Errorf("roomcast_config_reloads_total{result=%q} on %s: %v", result, ops, got)
			}
			return nil
		})
	}
	hup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	progress := func() { // both callers get through some more
		t.Helper()
		c, l := calls.Load(), logins.Load()
		testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
			if calls.Load() < c+5 || logins.Load() < l+2 {
				return errors.New("the callers do not get through")
			}
			return nil
		})
	}

	progress()
	// The API key: both keys on SIGHUP, the callers move to k2, then k2 alone on the file's
	// change.
	okSvc := reloads(t, svcOps, "ok")
	writeFile(t, keysFile, "k1=demo\nk2=demo\n")
	hup()
	waitReload(svcOps, "ok", okSvc)
	progress()
	key.Store("k2")
	progress()
	okSvc = reloads(t, svcOps, "ok")
	writeFile(t, keysFile, "k2=demo\n")
	waitReload(svcOps, "ok", okSvc)
	progress()
	if code, err := call("k1"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("the old key after the rotation: %d %v, want 401", code, err)
	}

	// The token secret, on SIGHUP.
	okLink := reloads(t, clOps, "ok")
	loginMu.Lock()
	writeFile(t, secretsFile, "demo="+newSecret+"\n")
	hup()
	waitReload(clOps, "ok", okLink)
	secret.Store(newSecret)
	loginMu.Unlock()
	progress()
	old := testkit.DialWS(t, url)
	if f := old.LoginAs(token(oldSecret), "test"); f.GetLoginAck() != nil {
		t.Errorf("a token of the old secret logged in after the rotation")
	}
	old.Close()
	if err := before.Ping(); err != nil {
		t.Errorf("the connection logged in before the rotation: %v", err)
	}

	// A file that does not parse: counted, the keys in force stay.
	errSvc := reloads(t, svcOps, "error")
	writeFile(t, keysFile, "no equals sign\n")
	waitReload(svcOps, "error", errSvc)
	progress()
	close(stop)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	if code, err := call("k2"); err != nil || code != 200 {
		t.Errorf("the key in force after a bad file: %d %v, want 200", code, err)
	}
	if !strings.Contains(svcOut.String(), "configuration not reloaded") {
		t.Errorf("the bad file was not logged:\n%s", svcOut.String())
	}
	t.Logf("%d API calls and %d logins during the rotations, none failed", calls.Load(), logins.Load())
}

// keyRecorder records the keyrings a reload sets.
type keyRecorder struct{ keys auth.Keyring }

func (k *keyRecorder) SetKeys(keys auth.Keyring) error {
	if len(keys) == 0 {
		return errors.New("no keys")
	}
	k.keys = keys
	return nil
}

// TestReloadLogLevel: a reload of the ChatLink's configuration sets the log level from -v in
// the config file; a file that does not parse changes nothing.
func TestReloadLogLevel(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "roomcast.yaml")
	writeFile(t, config, "chatlink:\n  node: n1\n  secret: [demo=s1]\n")
	args := []string{"--config", config}
	fs := configured(t, "chatlink", args...)
	var out syncBuffer
	lf := &logFlags{}
	log, _, closeLogs, err := lf.loggers(&out, "chatlink")
	if err != nil {
		t.Fatal(err)
	}
	defer closeLogs()
	node := &keyRecorder{}
	log.Debug("before")
	writeFile(t, config, "chatlink:\n  node: n1\n  secret: [demo=s2]\n  v: true\n")
	if err := reloadChatLink(fs, args, node, lf); err != nil {
		t.Fatal(err)
	}
	log.Debug("after")
	if string(node.keys["demo"]) != "s2" {
		t.Errorf("secrets after the reload: %q", node.keys)
	}
	writeFile(t, config, "chatlink:\n  node: n1\n  secret: [demo=s3]\n  v: maybe\n")
	if err := reloadChatLink(fs, args, node, lf); err == nil {
		t.Error("a config file with v: maybe reloaded")
	}
	log.Debug("still")
	if string(node.keys["demo"]) != "s2" {
		t.Errorf("secrets after a bad file: %q, want the last good ones", node.keys)
	}
	got := out.String()
	if strings.Contains(got, "before") || !strings.Contains(got, "after") || !strings.Contains(got, "still") {
		t.Errorf("debug lines written: %q; want those after the reload to -v only", got)
	}
}
