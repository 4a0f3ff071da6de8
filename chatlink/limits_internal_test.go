package chatlink

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestParseIPList(t *testing.T) {
	t.Parallel()
	l, err := parseIPList("# partners\nallow 192.0.2.0/24\n\nallow 2001:db8::/32\ndeny 192.0.2.66\n")
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{
		"192.0.2.1": true, "192.0.2.66": false, "198.51.100.1": false, "2001:db8::5": true, "::ffff:192.0.2.1": true,
	} {
		if got := l.Allows(netip.MustParseAddr(addr).Unmap()); got != want {
			t.Errorf("%s: allowed %v, want %v", addr, got, want)
		}
	}
	if l.Allows(netip.Addr{}) {
		t.Error("an unknown address passed an allow list")
	}
	for _, bad := range []string{"block 10.0.0.0/8", "deny 10.0.0.0/33", "deny", "allow example.com"} {
		if _, err := parseIPList(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// A list file that stops parsing leaves the lists read before in force.
func TestIPListReloadKeepsTheLastGoodList(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ips")
	if err := os.WriteFile(path, []byte("deny 198.51.100.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := newLimiter(Config{IPListFile: path})
	if err != nil {
		t.Fatal(err)
	}
	denied := netip.MustParseAddr("198.51.100.9")
	if l.admit(denied) == 0 {
		t.Fatal("denied address admitted")
	}
	if err := os.WriteFile(path, []byte("deny 198.51.100.0/24\nnonsense\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.reloadIPList(path, false); err == nil {
		t.Fatal("a list that does not parse was taken")
	}
	if l.admit(denied) == 0 {
		t.Fatal("the last good list was dropped")
	}
	// The same bad file is reported once, not at every look; SIGHUP (force) reads it again.
	if read, err := l.reloadIPList(path, false); read || err != nil {
		t.Fatalf("second look at the same bad file: read %v, err %v; want nothing", read, err)
	}
	if _, err := l.reloadIPList(path, true); err == nil {
		t.Fatal("a forced read of a bad file succeeded")
	}
	if _, err := newLimiter(Config{IPListFile: path}); err == nil {
		t.Fatal("a node started with a list that does not parse")
	}
}

// The per-address connection count is taken when a connection is admitted, before any answer
// lets its client open the next one, and given back by closed: a second connection of one
// address is refused while the first is in its handshake.
func TestAdmitCountsTheConnection(t *testing.T) {
	t.Parallel()
	l, err := newLimiter(Config{Limits: Limits{ConnectionsPerIP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("203.0.113.11")
	if code := l.admit(a); code != 0 {
		t.Fatalf("first connection refused with %v", code)
	}
	if code := l.admit(a); code == 0 {
		t.Fatal("second connection of one address admitted while the first was being made")
	}
	l.closed(a)
	if code := l.admit(a); code != 0 {
		t.Fatalf("connection after the first closed refused with %v", code)
	}
}
