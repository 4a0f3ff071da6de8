package certfiles_test

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"roomcast/internal/certfiles"
	"roomcast/internal/testkit/testcerts"
)

// clock is a clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// served returns the serial number of the certificate a real handshake with src's config
// presents.
func served(t *testing.T, src *certfiles.Source, ca *testcerts.CA) string {
	t.Helper()
	server, client := net.Pipe()
	defer server.Close()
	defer client.Close()
	done := make(chan error, 1)
	go func() { done <- tls.Server(server, src.ServerConfig()).Handshake() }()
	tc := tls.Client(client, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestReload(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t)
	dir := t.TempDir()
	first := ca.Issue(t)
	certFile, keyFile := first.Write(t, dir)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	src, err := certfiles.New(certfiles.Config{CertFile: certFile, KeyFile: keyFile, CheckEvery: 2 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	want := first.Cert.SerialNumber.String()
	if got := served(t, src, ca); got != want {
		t.Fatalf("serves serial %s, want %s", got, want)
	}

	second := ca.Issue(t)
	second.Write(t, dir)
	// Not before the check is due: the files are not even read.
	clk.add(time.Second)
	if got := served(t, src, ca); got != want {
		t.Fatalf("reloaded before CheckEvery passed: serves %s", got)
	}
	clk.add(time.Second)
	want = second.Cert.SerialNumber.String()
	if got := served(t, src, ca); got != want {
		t.Fatalf("after CheckEvery: serves serial %s, want the new %s", got, want)
	}
	if got := src.Certificate().SerialNumber.String(); got != want {
		t.Errorf("Certificate() is serial %s, want %s", got, want)
	}

	// A certificate whose key has not been written yet does not load: the current one stays,
	// and the pair loads at a later check once the key is there.
	third := ca.Issue(t)
	if err := os.WriteFile(certFile, third.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Second)
	if got := served(t, src, ca); got != want {
		t.Fatalf("a mismatched pair replaced the certificate: serves %s", got)
	}
	if err := os.WriteFile(keyFile, third.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Second)
	if got, want := served(t, src, ca), third.Cert.SerialNumber.String(); got != want {
		t.Fatalf("serves serial %s, want %s once the key is written", got, want)
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t).Write(t, dir)
	other := ca.Issue(t)
	otherKey := filepath.Join(dir, "other-key.pem")
	if err := os.WriteFile(otherKey, other.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		cert, key  string
		wantSubstr string
	}{
		{"no key file named", certFile, "", "both required"},
		{"missing file", certFile, filepath.Join(dir, "nope.pem"), "no such file"},
		{"key of another certificate", certFile, otherKey, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := certfiles.New(certfiles.Config{CertFile: tc.cert, KeyFile: tc.key})
			if err == nil || !strings.Contains(err.Error(), tc.wantSubstr) {
				t.Fatalf("New: %v, want an error about %q", err, tc.wantSubstr)
			}
		})
	}
	if _, err := certfiles.New(certfiles.Config{CertFile: certFile, KeyFile: keyFile}); err != nil {
		t.Fatalf("New with a good pair: %v", err)
	}
}
