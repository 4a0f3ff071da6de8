// Package certfiles serves a TLS server certificate from a PEM certificate file and key file,
// and takes up new files without a restart: a handshake checks, at most once per
// Config.CheckEvery, whether the files' contents changed, and loads them if so. The roles use
// it for the ChatLinks' wss:// and TLS TCP listeners and for the services' HTTP and gRPC
// listeners. With a ticket secret file it also seals the servers' TLS session tickets with
// keys derived from the secret and rotated on a period (tickets.go), so that the servers of a
// deployment resume each other's sessions. It only loads certificates and the secret: it never
// writes files, issues or verifies certificates, and starts no goroutine.
package certfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCheckEvery is how often, at most, the files are checked for changes.
const DefaultCheckEvery = 2 * time.Second

// Config names a server's certificate and key files.
type Config struct {
	// CertFile holds the PEM certificate chain, the server's certificate first. Empty means
	// no TLS (then KeyFile must be empty too).
	CertFile string
	// KeyFile holds the PEM private key of the certificate.
	KeyFile string
	// CheckEvery is how often, at most, a handshake re-reads the two files to see whether they
	// changed. Zero value means DefaultCheckEvery.
	CheckEvery time.Duration
	// Log receives a line for each reload and each failed one. Zero value means none.
	Log *slog.Logger
	// Now is the clock the checks are timed by, and the ticket keys' periods. Zero value means
	// time.Now.
	Now func() time.Time
	// TicketSecretFile names a file of at least 32 bytes, the same on every server of a
	// deployment, from which the TLS session-ticket keys are derived (tickets.go): a client
	// resumes its session on any of them. Zero value means crypto/tls's own keys, random to
	// each process: a session resumes only on the server that made it.
	TicketSecretFile string
	// TicketRotate is how long one ticket key seals new tickets; a ticket sealed by the key
	// before still resumes, so a ticket lives from one to two periods. Zero value means
	// DefaultTicketRotate (24h).
	TicketRotate time.Duration
}

// Enabled reports whether c names files: whether TLS is asked for.
func (c Config) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

func (c Config) withDefaults() (Config, error) {
	if c.CertFile == "" || c.KeyFile == "" {
		return c, errors.New("certfiles: a certificate file and a key file are both required")
	}
	if c.CheckEvery <= 0 {
		c.CheckEvery = DefaultCheckEvery
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.TicketRotate <= 0 {
		c.TicketRotate = DefaultTicketRotate
	}
	return c, nil
}

// Source hands out the certificate loaded from the files.
type Source struct {
	cfg       Config
	tickets   *ticketKeys                     // nil without Config.TicketSecretFile
	cert      atomic.Pointer[tls.Certificate] // the one handshakes get
	nextCheck atomic.Int64                    // unix nanoseconds: no check before

	mu       sync.Mutex // guards the fields below; held by the one handshake that checks
	certPEM  []byte     // the files' contents the current certificate was loaded from
	keyPEM   []byte
	failedAs string // the last failed load's error, so it is logged once, not every check
}

// New loads the files; it fails if they do not hold a certificate and its key.
func New(cfg Config) (*Source, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg}
	if cfg.TicketSecretFile != "" {
		if s.tickets, err = newTicketKeys(cfg.TicketSecretFile, cfg.TicketRotate, cfg.Now); err != nil {
			return nil, err
		}
	}
	certPEM, keyPEM, err := s.read()
	if err != nil {
		return nil, err
	}
	if err := s.load(certPEM, keyPEM); err != nil {
		return nil, err
	}
	s.nextCheck.Store(cfg.Now().Add(cfg.CheckEvery).UnixNano())
	return s, nil
}

// ServerConfig returns a TLS server config (TLS 1.2 at least) whose handshakes get the
// current certificate, and whose session tickets are sealed with the keys derived from
// Config.TicketSecretFile, if set.
func (s *Source) ServerConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.GetCertificate}
	if s.tickets != nil {
		cfg.WrapSession, cfg.UnwrapSession = s.tickets.wrap, s.tickets.unwrap
	}
	return cfg
}

// GetCertificate returns the current certificate, first reloading the files when the check
// is due and they changed. A change that does not load (a certificate without its new key yet,
// a broken file) keeps the current certificate, is logged, and is tried again at the next
// check. Only one handshake checks at a time; the others go on with the current certificate.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := s.cfg.Now().UnixNano()
	if next := s.nextCheck.Load(); now >= next && s.nextCheck.CompareAndSwap(next, now+s.cfg.CheckEvery.Nanoseconds()) {
		s.check()
	}
	return s.cert.Load(), nil
}

// Certificate returns the certificate handshakes get now, parsed.
func (s *Source) Certificate() *x509.Certificate { return s.cert.Load().Leaf }

// check reloads the files if their contents changed.
func (s *Source) check() {
	certPEM, keyPEM, err := s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && bytes.Equal(certPEM, s.certPEM) && bytes.Equal(keyPEM, s.keyPEM) {
		return
	}
	if err == nil {
		err = s.load(certPEM, keyPEM)
	}
	if err != nil {
		if msg := err.Error(); msg != s.failedAs {
			s.failedAs = msg
			s.cfg.Log.Warn("tls certificate not reloaded; keeping the current one", "err", err)
		}
		return
	}
	leaf := s.cert.Load().Leaf
	s.cfg.Log.Info("tls certificate reloaded", "file", s.cfg.CertFile,
		"serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
}

// read returns the two files' contents.
func (s *Source) read() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(s.cfg.CertFile); err != nil {
		return nil, nil, fmt.Errorf("certfiles: %w", err)
	}
	if keyPEM, err = os.ReadFile(s.cfg.KeyFile); err != nil {
		return nil, nil, fmt.Errorf("certfiles: %w", err)
	}
	return certPEM, keyPEM, nil
}

// load parses the files' contents and makes them the current certificate. Caller holds s.mu,
// or has not shared s yet.
func (s *Source) load(certPEM, keyPEM []byte) error {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("certfiles: %s and %s: %w", s.cfg.CertFile, s.cfg.KeyFile, err)
	}
	s.certPEM, s.keyPEM, s.failedAs = certPEM, keyPEM, ""
	s.cert.Store(&cert)
	return nil
}
