package tlswire

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcerts"
)

func TestRecordFraming(t *testing.T) {
	big := []byte{23, 3, 3, 0x48, 0x01} // announces 0x4801 bytes: more than MaxRecord
	for _, c := range []struct {
		name  string
		in    []byte
		len   int
		ok    bool
		whole bool
	}{
		{"nothing", nil, 0, false, false},
		{"part of a header", []byte{23, 3, 3, 0}, 0, false, false},
		{"a header, no payload", []byte{23, 3, 3, 0, 2}, 7, true, false},
		{"part of the payload", []byte{23, 3, 3, 0, 2, 9}, 7, true, false},
		{"a whole record", []byte{23, 3, 3, 0, 2, 9, 9}, 7, true, true},
		{"a record and more", []byte{23, 3, 3, 0, 2, 9, 9, 23, 3}, 7, true, true},
		{"an empty record", []byte{23, 3, 3, 0, 0}, 5, true, true},
		// The length is big-endian: 0x0101 is 257 bytes of payload.
		{"a long record, part", append([]byte{22, 3, 1, 1, 1}, make([]byte, 256)...), 262, true, false},
		{"a long record, whole", append([]byte{22, 3, 1, 1, 1}, make([]byte, 257)...), 262, true, true},
		{"the largest record, part", append([]byte{23, 3, 3, 0x48, 0}, make([]byte, 100)...), MaxRecord, true, false},
		{"a refused length", big, HeaderLen + 0x4801, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, ok := RecordLen(c.in)
			if n != c.len || ok != c.ok {
				t.Errorf("RecordLen = %d, %v; want %d, %v", n, ok, c.len, c.ok)
			}
			if got := Whole(c.in); got != c.whole {
				t.Errorf("Whole = %v, want %v", got, c.whole)
			}
		})
	}
}

// configs returns a server config with a certificate of a new CA's, and a client config
// that trusts it.
func configs(t testing.TB) (server, client *tls.Config) {
	ca := testcerts.NewCA(t)
	certFile, keyFile := ca.Issue(t).Write(t, t.TempDir())
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
}

// session shakes hands over a loopback pair, the server over a Wire, then polls the Wire; it
// returns the server's tls.Conn and Wire, the server's socket (which the Wire no longer
// reads) and the client, whose Writes are records the test then feeds the Wire.
func session(t testing.TB, server, client *tls.Config) (*tls.Conn, *Wire, net.Conn, *tls.Conn) {
	s, c := testkit.TCPPair(t)
	tc := tls.Client(c, client)
	done := make(chan error, 1)
	go func() { done <- tc.Handshake() }()
	w := New(s)
	sc := tls.Server(w, server)
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := sc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = s.SetDeadline(time.Time{})
	w.Poll(func([]byte) {})
	return sc, w, s, tc
}

// recorded returns the bytes the client's writes of msgs put on the wire, as the server's
// socket reads them.
func recorded(t testing.TB, sock net.Conn, client *tls.Conn, msgs [][]byte) []byte {
	var want int
	go func() {
		for _, m := range msgs {
			_, _ = client.Write(m)
		}
	}()
	for _, m := range msgs {
		want += len(m)
	}
	var raw []byte
	buf := make([]byte, 4096)
	_ = sock.SetReadDeadline(time.Now().Add(10 * time.Second))
	// Each message is one record of its length and 22 bytes of overhead (TLS 1.3, AES-GCM).
	for len(raw) < want+22*len(msgs) {
		n, err := sock.Read(buf)
		if err != nil {
			t.Fatalf("read %d bytes of the client's records: %v", len(raw), err)
		}
		raw = append(raw, buf[:n]...)
	}
	return raw
}

// feed gives w the raw bytes in chunks of the sizes sizes names (cycling), reading sc each time
// a whole record is there, as the ChatLink's poller does, and returns the plaintext.
func feed(t testing.TB, sc *tls.Conn, w *Wire, raw []byte, sizes []byte) []byte {
	var got []byte
	plain := make([]byte, 16<<10)
	for i := 0; len(raw) > 0; i++ {
		k := 1
		if len(sizes) > 0 {
			k = int(sizes[i%len(sizes)]) + 1
		}
		k = min(k, len(raw))
		chunk := append([]byte(nil), raw[:k]...) // the caller's buffer is reused after Settle
		raw = raw[k:]
		w.Append(chunk)
		for w.HasRecord() {
			n, err := sc.Read(plain)
			got = append(got, plain[:n]...)
			if errors.Is(err, ErrWouldBlock) {
				break
			}
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
		}
		w.Settle()
		clear(chunk) // what the Wire kept must be its own
		if w.Buffered() == 0 && !Release(sc) {
			t.Fatal("Release gave nothing back with every record read (a Go release renamed crypto/tls's buffers?)")
		}
		if w.Buffered() >= MaxRecord {
			t.Fatalf("%d bytes buffered: more than a record", w.Buffered())
		}
	}
	if w.Buffered() != 0 {
		t.Fatalf("%d bytes left buffered", w.Buffered())
	}
	return got
}

// TestWireTrickle: records that come a byte at a time, or cut anywhere, are each read whole
// once their last byte is there, and a Read never waits nor fails for want of bytes.
func TestWireTrickle(t *testing.T) {
	server, client := configs(t)
	msgs := [][]byte{[]byte("hello"), bytes.Repeat([]byte("x"), 5000), {}, []byte("bye")}
	var want []byte
	for _, m := range msgs {
		want = append(want, m...)
	}
	for _, sizes := range [][]byte{nil, {2}, {0, 6, 200}, {255, 255, 255}, {4, 20}} {
		sc, w, sock, tc := session(t, server, client)
		raw := recorded(t, sock, tc, msgs)
		if got := feed(t, sc, w, raw, sizes); !bytes.Equal(got, want) {
			t.Fatalf("chunks %v: read %q..., want %q...", sizes, got[:min(len(got), 20)], want[:20])
		}
		// Nothing is buffered: a Read returns at once, with the temporary error.
		n, err := sc.Read(make([]byte, 10))
		var ne net.Error
		//lint:ignore SA1019 crypto/tls keeps a read error that is not Temporary: the mechanism rests on it
		if n != 0 || !errors.Is(err, ErrWouldBlock) || !errors.As(err, &ne) || !ne.Temporary() {
			t.Fatalf("Read with nothing buffered = %d, %v", n, err)
		}
		// The connection still works: crypto/tls took the error as temporary.
		raw = recorded(t, sock, tc, [][]byte{[]byte("again")})
		if got := feed(t, sc, w, raw, nil); string(got) != "again" {
			t.Fatalf("after a would-block: %q", got)
		}
	}
}

// FuzzWire cuts a client's records at the places the input names.
func FuzzWire(f *testing.F) {
	server, client := configs(f)
	f.Add([]byte{0})
	f.Add([]byte{3, 200, 17})
	f.Add([]byte{255})
	msgs := [][]byte{[]byte("one"), bytes.Repeat([]byte("two"), 700), []byte("three")}
	want := bytes.Join(msgs, nil)
	f.Fuzz(func(t *testing.T, sizes []byte) {
		sc, w, sock, tc := session(t, server, client)
		raw := recorded(t, sock, tc, msgs)
		if got := feed(t, sc, w, raw, sizes); !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes, want %d", len(got), len(want))
		}
	})
}

// TestWireBeforePoll: before Poll a Wire reads its socket as a net.Conn does, but hands crypto/tls
// one record at a time, so the records behind the handshake stay in the Wire, not in the
// tls.Conn, for the poller's first read.
func TestWireBeforePoll(t *testing.T) {
	server, client := configs(t)
	s, c := testkit.TCPPair(t)
	go func() {
		tc := tls.Client(c, client)
		if tc.Handshake() == nil {
			_, _ = tc.Write([]byte("right behind"))
		}
	}()
	w := New(s)
	sc := tls.Server(w, server)
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := sc.Handshake(); err != nil {
		t.Fatal(err)
	}
	// Wait until the record is in the Wire: read through the Wire, then put it back.
	for w.Buffered() == 0 || !w.HasRecord() {
		if err := w.fill(); err != nil {
			t.Fatal(err)
		}
	}
	w.Poll(func([]byte) {})
	buf := make([]byte, 64)
	n, err := sc.Read(buf)
	if err != nil || string(buf[:n]) != "right behind" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if _, err := sc.Read(buf); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("a second Read: %v", err)
	}
}
