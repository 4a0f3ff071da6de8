package testkit

import (
	"net"
	"testing"
)

// FreeAddr returns a loopback address with a port free right now, for a listener a test names
// before it opens.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TCPPair returns both ends of a loopback TCP connection, closed when the test ends: the side
// a server accepted, and the client's.
func TCPPair(t testing.TB) (server *net.TCPConn, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); s.Close() })
	return s.(*net.TCPConn), client
}
