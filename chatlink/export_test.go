package chatlink

// Sweep runs the sweep once, as every tick of the node's sweep loop does: a test that moves
// the node's clock (Config.Now) then knows the sweep has seen the new time.
func (n *Node) Sweep() { n.sweep() }

// IsSSERequest is isSSERequest, for the external tests.
var IsSSERequest = isSSERequest

// NoticeOffset is noticeOffset: a room's moment within an app-wide notice's spread.
var NoticeOffset = noticeOffset
