package chatlink

import (
	"testing"
	"unsafe"

	"github.com/lxzan/gws"
)

// TestConnStateIsLean guards the per-connection state this package adds to each socket: every
// byte here is multiplied by the connections of a node.
func TestConnStateIsLean(t *testing.T) {
	t.Parallel()
	sizes := map[string]uintptr{
		"conn":        unsafe.Sizeof(conn{}),
		"wsTransport": unsafe.Sizeof(wsTransport{}),
		"wsSlot":      unsafe.Sizeof(wsSlot{}),
	}
	t.Logf("bytes: conn %d, wsTransport %d, wsSlot %d (gws.Conn %d)", sizes["conn"], sizes["wsTransport"], sizes["wsSlot"], unsafe.Sizeof(gws.Conn{}))
	if sizes["conn"] > 208 {
		t.Errorf("conn is %d bytes, over its 208-byte budget", sizes["conn"])
	}
}
