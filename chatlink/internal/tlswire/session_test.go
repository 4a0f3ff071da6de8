package tlswire

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"roomcast/internal/testkit"
)

// openAll gives w raw and opens every whole record with s, answering key updates into answers;
// it returns the data and the first error.
func openAll(s *Session, w *Wire, raw []byte, answers *[]byte) ([]byte, error) {
	var got []byte
	w.Append(append([]byte(nil), raw...))
	for {
		rec, ok := w.Next()
		if !ok {
			break
		}
		data, answer, err := s.Open(rec)
		got = append(got, data...)
		if answer {
			*answers = s.SealKeyUpdate(*answers)
		}
		if err != nil {
			return got, err
		}
	}
	w.Settle()
	s.DropIn()
	return got, nil
}

// readN reads n bytes of records from sock (the peer's, as the other side's socket reads them).
func readN(t *testing.T, sock net.Conn, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	_ = sock.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(sock, buf); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return buf
}

// TestDetachedServer: a server Session taken over from crypto/tls after both sides have sent
// records (so neither sequence number is zero) talks to a crypto/tls client both ways (AES-128-GCM:
// crypto/tls's choice when the client offers it, as browsers do first), with
// records of up to 16 KiB and messages cut over several, its ciphers let go and built again
// between records; the client's close_notify ends the stream.
func TestDetachedServer(t *testing.T) {
	server, client := configs(t)
	client.ClientSessionCache = tls.NewLRUClientSessionCache(4) // the server sends it a ticket
	sc, w, sock, tc := session(t, server, client)
	if got := tc.ConnectionState().CipherSuite; got != tls.TLS_AES_128_GCM_SHA256 {
		t.Fatalf("negotiated %s", tls.CipherSuiteName(got))
	}
	// Before the take-over: a record each way.
	raw := recorded(t, sock, tc, [][]byte{[]byte("before")})
	if got := feed(t, sc, w, raw, nil); string(got) != "before" {
		t.Fatalf("before: %q", got)
	}
	s, ok := Detach(sc)
	if !ok {
		t.Fatal("Detach declined a TLS 1.3 AES-GCM connection with nothing buffered (a Go release changed crypto/tls's fields?)")
	}
	if s.out.seq == 0 || s.in.seq == 0 {
		t.Fatalf("sequence numbers in %d, out %d: the session tickets and the record read count", s.in.seq, s.out.seq)
	}

	msgs := [][]byte{[]byte("hello"), bytes.Repeat([]byte("x"), 5000), []byte("bye")}
	var answers []byte
	for i, m := range msgs {
		raw := recorded(t, sock, tc, [][]byte{m})
		got, err := openAll(s, w, raw, &answers)
		if err != nil || !bytes.Equal(got, m) {
			t.Fatalf("message %d: %d bytes, %v", i, len(got), err)
		}
	}
	if len(answers) != 0 {
		t.Fatal("answered a key update nobody asked for")
	}

	// Server to client: two messages, one over two records, the sending cipher let go
	// between them.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1500) // 24,000 bytes
	out := s.Seal(nil, []byte("first"))
	s.DropIdleOut()
	s.DropIdleOut()
	if s.out.aead != nil {
		t.Fatal("DropIdleOut kept the cipher of a side idle since the last call")
	}
	out = s.Seal(out, big)
	if want := 2*HeaderLen + 2*17 + 5 + HeaderLen + 17 + len(big); len(out) != want {
		t.Fatalf("sealed %d bytes, want %d (three records)", len(out), want)
	}
	go func() { _, _ = sock.Write(out) }()
	_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 5+len(big))
	if _, err := io.ReadFull(tc, got); err != nil || string(got[:5]) != "first" || !bytes.Equal(got[5:], big) {
		t.Fatalf("the client read %q..., %v", got[:min(20, len(got))], err)
	}

	// The client closes: close_notify.
	go func() { _ = tc.Close() }()
	raw = readN(t, sock, HeaderLen+2+1+16)
	if _, err := openAll(s, w, raw, &answers); err != io.EOF {
		t.Fatalf("close_notify: %v, want io.EOF", err)
	}
}

// TestDetachedKeyUpdate: a detached client asks a crypto/tls server for a key update; the
// server reads what follows under the client's new keys, and answers with its own key update,
// under whose keys the client reads the server's next record.
func TestDetachedKeyUpdate(t *testing.T) {
	server, client := configs(t)
	s, c := testkit.TCPPair(t)
	sc := tls.Server(s, server)
	done := make(chan error, 1)
	go func() { done <- sc.Handshake() }()
	w := New(c)
	tc := tls.Client(w, client)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The server's session ticket: the client reads it before it is taken over.
	go func() { _, _ = sc.Write([]byte("ticket first")) }()
	buf := make([]byte, 64)
	if n, err := tc.Read(buf); err != nil || string(buf[:n]) != "ticket first" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	w.Poll(nil)
	cs, ok := Detach(tc)
	if !ok {
		t.Fatal("Detach declined the client")
	}
	out := cs.seal(nil, typeHandshake, []byte{typeKeyUpdate, 0, 0, 1, 1}) // update_requested
	cs.update(&cs.out)
	out = cs.Seal(out, []byte("under new keys"))
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	_ = sc.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := sc.Read(buf); err != nil || string(buf[:n]) != "under new keys" {
		t.Fatalf("the server read %q, %v", buf[:n], err)
	}
	if _, err := sc.Write([]byte("answered")); err != nil {
		t.Fatal(err)
	}
	// The server's KeyUpdate (6 + 16 bytes of record) and its data.
	raw := readN(t, c, HeaderLen+5+1+16+HeaderLen+len("answered")+1+16)
	var answers []byte
	got, err := openAll(cs, w, raw, &answers)
	if err != nil || string(got) != "answered" || len(answers) != 0 {
		t.Fatalf("the client read %q, %v (answers %d bytes)", got, err, len(answers))
	}
}

// peerOf returns the other side of s, as far as sealing goes: a Session that seals records
// under the keys s opens with.
func peerOf(s *Session) *Session {
	return &Session{hash: s.hash, hashLen: s.hashLen, keyLen: s.keyLen, out: s.in}
}

// TestOpenRefuses: what Open refuses, and the alert it names.
func TestOpenRefuses(t *testing.T) {
	server, client := configs(t)
	for _, c := range []struct {
		name string
		rec  func(peer *Session) []byte
		want error
	}{
		{"a flipped byte", func(peer *Session) []byte {
			rec := peer.Seal(nil, []byte("a good record"))
			rec[len(rec)-3] ^= 1
			return rec
		}, AlertBadRecordMAC},
		{"a record too long", func(*Session) []byte { return []byte{23, 3, 3, 0x41, 0x11} }, AlertRecordOverflow},
		{"too short for a tag", func(*Session) []byte { return []byte{23, 3, 3, 0, 3, 1, 2, 3} }, AlertBadRecordMAC},
		{"a plaintext alert", func(*Session) []byte { return []byte{21, 3, 3, 0, 2, 2, 40} }, AlertUnexpectedMessage},
		{"a handshake message but a key update", func(s *Session) []byte {
			return s.seal(nil, typeHandshake, []byte{4, 0, 0, 1, 0}) // NewSessionTicket
		}, AlertUnexpectedMessage},
		{"a key update with a bad value", func(s *Session) []byte {
			return s.seal(nil, typeHandshake, []byte{typeKeyUpdate, 0, 0, 1, 7})
		}, AlertDecodeError},
		{"the peer's alert", func(s *Session) []byte { return s.SealAlert(nil, 42) }, RemoteAlert(42)},
		{"only padding", func(s *Session) []byte { return s.seal(nil, 0, nil) }, AlertUnexpectedMessage},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc, _, _, _ := session(t, server, client)
			s, ok := Detach(sc)
			if !ok {
				t.Fatal("Detach declined")
			}
			peer := peerOf(s)
			_, _, err := s.Open(c.rec(peer))
			if !errors.Is(err, c.want) {
				t.Fatalf("Open: %v, want %v", err, c.want)
			}
		})
	}
}

// TestOpenUseless: a peer that sends nothing but empty records is cut off.
func TestOpenUseless(t *testing.T) {
	server, client := configs(t)
	sc, _, _, _ := session(t, server, client)
	s, _ := Detach(sc)
	peer := peerOf(s)
	var err error
	for i := 0; i <= maxUseless && err == nil; i++ {
		_, _, err = s.Open(peer.seal(nil, typeData, nil))
	}
	if !errors.Is(err, AlertUnexpectedMessage) {
		t.Fatalf("after %d empty records: %v", maxUseless+1, err)
	}
}

// TestDetachDeclines: Detach leaves a connection to crypto/tls when it holds bytes not handed
// out, or speaks TLS 1.2.
func TestDetachDeclines(t *testing.T) {
	server, client := configs(t)
	cl := client.Clone()
	cl.MaxVersion = tls.VersionTLS12
	sc, _, _, _ := session(t, server, cl)
	if _, ok := Detach(sc); ok {
		t.Fatal("Detach took over a TLS 1.2 connection")
	}
	sc, w, sock, tc := session(t, server, client)
	raw := recorded(t, sock, tc, [][]byte{[]byte("twelve bytes")})
	w.Append(raw)
	if n, err := sc.Read(make([]byte, 4)); n != 4 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if _, ok := Detach(sc); ok {
		t.Fatal("Detach took over a connection holding 8 bytes it read")
	}
}

// FuzzOpen opens records whose inner plaintext (content, type and padding, RFC 8446 section
// 5.2) is the input, sealed under the right keys: whatever a peer puts inside a record, Open
// neither panics nor hands out more than the content, and a refusal names an alert.
func FuzzOpen(f *testing.F) {
	server, client := configs(f)
	sc, _, _, _ := session(f, server, client)
	base, ok := Detach(sc)
	if !ok {
		f.Fatal("Detach declined")
	}
	f.Add([]byte("hello\x17"))
	f.Add([]byte("hello\x17\x00\x00\x00"))
	f.Add([]byte{typeKeyUpdate, 0, 0, 1, 1, typeHandshake})
	f.Add([]byte{typeKeyUpdate, 0, 0, typeHandshake})
	f.Add([]byte{1, 0, typeAlert})
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, inner []byte) {
		s := *base
		peer := peerOf(&s)
		s.in.aead, peer.out.aead = nil, nil
		// Seal inner as it is: seal appends a type byte, which is the last byte of inner here.
		if len(inner) == 0 {
			inner = []byte{0}
		}
		rec := peer.seal(nil, inner[len(inner)-1], inner[:len(inner)-1])
		data, _, err := s.Open(rec)
		if len(data) > len(inner) {
			t.Fatalf("handed out %d bytes of a %d-byte inner plaintext", len(data), len(inner))
		}
		var alert Alert
		var remote RemoteAlert
		if err != nil && err != io.EOF && !errors.As(err, &alert) && !errors.As(err, &remote) {
			t.Fatalf("Open: %v", err)
		}
	})
}

// TestOpenSSLClient: OpenSSL's client, made to choose each AES-GCM suite (Go clients and browsers
// choose AES-128 where they offer it), sends a line to a Session taken over after the handshake
// and reads its answer and close_notify.
func TestOpenSSLClient(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("openssl not found (make tools installs Debian's openssl)")
	}
	server, _ := configs(t)
	for _, suite := range []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384} {
		t.Run(tls.CipherSuiteName(suite), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", ln.Addr().String(), "-tls1_3",
				"-ciphersuites", tls.CipherSuiteName(suite), "-quiet")
			cmd.Stdin = strings.NewReader("hello from openssl\n")
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sock, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sock.Close()
			_ = sock.SetDeadline(time.Now().Add(15 * time.Second))
			w := New(sock)
			sc := tls.Server(w, server)
			if err := sc.Handshake(); err != nil {
				t.Fatalf("handshake: %v (%s)", err, errOut.String())
			}
			if got := sc.ConnectionState().CipherSuite; got != suite {
				t.Fatalf("negotiated %s", tls.CipherSuiteName(got))
			}
			w.Poll(nil)
			s, ok := Detach(sc)
			if !ok {
				t.Fatal("Detach declined")
			}
			// The line may have come behind the client's Finished, into the Wire during the
			// handshake: open what the Wire holds before reading the socket.
			var answers []byte
			got, err := openAll(s, w, nil, &answers)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			buf := make([]byte, 4096)
			for !bytes.Contains(got, []byte("\n")) {
				n, err := sock.Read(buf)
				if err != nil {
					t.Fatalf("read: %v after %q", err, got)
				}
				data, err := openAll(s, w, buf[:n], &answers)
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				got = append(got, data...)
			}
			if string(got) != "hello from openssl\n" {
				t.Fatalf("read %q", got)
			}
			reply := s.SealAlert(s.Seal(nil, []byte("hello from go\n")), AlertCloseNotify)
			if _, err := sock.Write(reply); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait() // s_client ends at the close_notify
			if !strings.Contains(out.String(), "hello from go") {
				t.Fatalf("openssl printed %q (stderr %q)", out.String(), errOut.String())
			}
		})
	}
}
