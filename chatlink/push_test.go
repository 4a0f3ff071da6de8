package chatlink

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "roomcast/proto/roomcastpb"
)

func TestPushFramesSplit(t *testing.T) {
	t.Parallel()
	var msgs []*pb.Message
	for i := range 100 { // a full room history of the largest messages
		msgs = append(msgs, &pb.Message{Id: string(rune('a' + i%26)), Room: "r", Sender: "u", Lane: pb.Lane_LANE_NORMAL,
			Body: bytes.Repeat([]byte{byte(i)}, 16<<10)})
	}
	for _, tc := range []struct {
		msgs      []*pb.Message
		wantFrame int
	}{{msgs[:1], 1}, {msgs[:3], 1}, {msgs, 34}} {
		frames := pushFrames(tc.msgs, true)
		var got []*pb.Message
		for _, b := range frames {
			if len(b) > maxPushFrame {
				t.Fatalf("frame of %d bytes", len(b))
			}
			var f pb.Frame
			if err := proto.Unmarshal(b, &f); err != nil || !f.GetPush().GetRecovered() {
				t.Fatalf("frame does not parse as a recovered Push: %v", err)
			}
			got = append(got, f.GetPush().GetMessages()...)
		}
		if len(frames) != tc.wantFrame || len(got) != len(tc.msgs) {
			t.Fatalf("%d messages: %d frames with %d messages, want %d frames", len(tc.msgs), len(frames), len(got), tc.wantFrame)
		}
		for i := range got {
			if !proto.Equal(got[i], tc.msgs[i]) {
				t.Fatalf("message %d changed or out of order", i)
			}
		}
	}
	if pushFrames(nil, false) != nil {
		t.Fatal("frames for no messages")
	}
}
