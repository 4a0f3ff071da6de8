package loadgen

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// TestFeedSplitsFrames feeds a poller-read member its server's frames cut into pieces of every
// size: WebSocket frames with each of the three length forms, and length-prefixed TCP frames.
// Every message arrives once, in order, whatever the cuts.
func TestFeedSplitsFrames(t *testing.T) {
	t.Parallel()
	var frames [][]byte
	var want []string
	for i, size := range []int{10, 300, 70_000, 1} {
		body := strings.Repeat(string(rune('a'+i)), size)
		want = append(want, fmt.Sprintf("%d:%d", i, size))
		b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{
			Messages: []*clientpb.Message{{Lane: clientpb.Lane(i % 3), Body: []byte(body)}}}}})
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, b)
	}
	for _, ws := range []bool{true, false} {
		var stream []byte
		for _, f := range frames {
			if ws {
				stream = append(stream, 0x82)
				switch {
				case len(f) < 126:
					stream = append(stream, byte(len(f)))
				case len(f) < 1<<16:
					stream = binary.BigEndian.AppendUint16(append(stream, 126), uint16(len(f)))
				default:
					stream = binary.BigEndian.AppendUint64(append(stream, 127), uint64(len(f)))
				}
			} else {
				stream = binary.BigEndian.AppendUint32(stream, uint32(len(f)))
			}
			stream = append(stream, f...)
		}
		for _, cut := range []int{1, 2, 3, 7, 126, 4096, len(stream)} {
			var got []string
			c := &rawClient{onMsg: func(lane int32, body []byte) {
				got = append(got, fmt.Sprintf("%d:%d", body[0]-'a', len(body)))
			}}
			c.isWS = ws
			for rest := stream; len(rest) > 0; {
				k := min(cut, len(rest))
				// The poller's buffer is reused after each read: hand feed a copy it may not keep.
				piece := append([]byte(nil), rest[:k]...)
				if err := c.feed(piece); err != nil {
					t.Fatalf("ws %v, cut %d: %v", ws, cut, err)
				}
				clear(piece)
				rest = rest[k:]
			}
			if fmt.Sprint(got) != fmt.Sprint(want) || len(c.part) != 0 {
				t.Fatalf("ws %v, cut %d: got %v (%d bytes left), want %v", ws, cut, got, len(c.part), want)
			}
		}
	}

	// A masked or fragmented frame from the server, or a close frame, ends the connection.
	for name, b := range map[string][]byte{
		"masked":     {0x82, 0x81, 1, 2, 3, 4, 0},
		"fragmented": {0x02, 0x01, 0},
		"close":      {0x88, 0x02, 0x03, 0xe8},
	} {
		c := &rawClient{isWS: true, onMsg: func(int32, []byte) {}}
		if err := c.feed(b); err == nil {
			t.Errorf("%s frame: no error", name)
		}
	}
}

// TestReadLoop: without pollers a member's own reader hands what it reads to feed, and the end
// of the stream ends the member.
func TestReadLoop(t *testing.T) {
	t.Parallel()
	srv, cl := net.Pipe()
	var got []string
	c := &rawClient{nc: cl, done: make(chan struct{}), onMsg: func(_ int32, body []byte) { got = append(got, string(body)) }}
	go c.readLoop()
	for _, body := range []string{"a", "bc"} {
		b, err := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{
			Messages: []*clientpb.Message{{Body: []byte(body)}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Write(lengthPrefixed(b)); err != nil {
			t.Fatal(err)
		}
	}
	_ = srv.Close()
	<-c.done
	if fmt.Sprint(got) != "[a bc]" || c.Err() == nil || !strings.Contains(c.Err().Error(), "connection closed") {
		t.Fatalf("got %v, err %v; want [a bc] and a closed connection", got, c.Err())
	}
}

// TestBeatEveryFollowsTheServer: a raw member takes its heartbeat interval from the LoginAck
// and then from each HeartbeatAck, as the SDK does, and keeps it when an answer names none.
func TestBeatEveryFollowsTheServer(t *testing.T) {
	t.Parallel()
	c := &rawClient{acked: make(chan struct{})}
	for _, tc := range []struct {
		f    *clientpb.Frame
		want time.Duration
	}{
		{&clientpb.Frame{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{HeartbeatIntervalMs: 25_000}}}, 25 * time.Second},
		{&clientpb.Frame{Kind: &clientpb.Frame_HeartbeatAck{HeartbeatAck: &clientpb.HeartbeatAck{HeartbeatIntervalMs: 30_000}}}, 30 * time.Second},
		{&clientpb.Frame{Kind: &clientpb.Frame_HeartbeatAck{HeartbeatAck: &clientpb.HeartbeatAck{}}}, 30 * time.Second},
	} {
		b, err := proto.Marshal(tc.f)
		if err != nil {
			t.Fatal(err)
		}
		c.frame(b)
		if got := time.Duration(c.beatEvery.Load()); got != tc.want {
			t.Fatalf("after %v the member beats every %v, want %v", tc.f, got, tc.want)
		}
	}
}
