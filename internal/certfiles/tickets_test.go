package certfiles_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"roomcast/internal/certfiles"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcerts"
)

// resumes makes a handshake with src's config, the client's session cache given, reads a byte
// (which takes in the tickets a TLS 1.3 server sends after its handshake) and reports whether
// the session resumed.
func resumes(t *testing.T, src *certfiles.Source, client *tls.Config) bool {
	t.Helper()
	s, c := testkit.TCPPair(t)
	done := make(chan error, 1)
	go func() {
		tc := tls.Server(s, src.ServerConfig())
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		_, err := tc.Write([]byte{1})
		done <- err
	}()
	tc := tls.Client(c, client)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return tc.ConnectionState().DidResume
}

// TestTicketKeys: servers sharing a ticket secret resume each other's sessions in the period a
// ticket was sealed and the next, not later, and not with another secret.
func TestTicketKeys(t *testing.T) {
	ca := testcerts.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t).Write(t, dir)
	secret := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared, other := secret("shared", strings.Repeat("s", 40)), secret("other", strings.Repeat("o", 40))
	clk := &clock{now: time.Unix(1_000_000, 0)}
	source := func(file string) *certfiles.Source {
		src, err := certfiles.New(certfiles.Config{CertFile: certFile, KeyFile: keyFile, TicketSecretFile: file, TicketRotate: time.Hour, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	a, b, c := source(shared), source(shared), source(other)
	if _, err := certfiles.New(certfiles.Config{CertFile: certFile, KeyFile: keyFile, TicketSecretFile: secret("short", "too short")}); err == nil {
		t.Fatal("a secret of 9 bytes was taken")
	}

	for _, step := range []struct {
		name   string
		ticket *certfiles.Source // gives the client its ticket
		then   time.Duration     // the clock moves
		server *certfiles.Source
		want   bool
	}{
		{"same secret, same period", a, 0, b, true},
		{"same secret, next period", a, time.Hour, b, true},
		{"same secret, two periods on", a, 2 * time.Hour, b, false},
		{"another secret", a, 0, c, false},
	} {
		t.Run(step.name, func(t *testing.T) {
			client := ca.ClientConfig()
			client.ServerName = "localhost"
			client.ClientSessionCache = tls.NewLRUClientSessionCache(1)
			if resumes(t, step.ticket, client) {
				t.Fatal("the first handshake resumed")
			}
			clk.add(step.then)
			if got := resumes(t, step.server, client); got != step.want {
				t.Fatalf("resumed: %v, want %v", got, step.want)
			}
		})
	}
}
