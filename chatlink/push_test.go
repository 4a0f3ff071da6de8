package chatlink

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

func TestPushFramesSplit(t *testing.T) {
	t.Parallel()
	var msgs []*clientpb.Message
	for i := range 100 { // a full room history of the largest messages
		msgs = append(msgs, &clientpb.Message{Id: string(rune('a' + i%26)), Room: "r", Sender: "u", Lane: clientpb.Lane_LANE_NORMAL,
			Body: bytes.Repeat([]byte{byte(i)}, 16<<10)})
	}
	for _, tc := range []struct {
		msgs      []*clientpb.Message
		wantFrame int
	}{{msgs[:1], 1}, {msgs[:3], 1}, {msgs, 34}} {
		meta := pushMeta{history: true, recovery: &clientpb.Recovery{Missing: 7}, thinned: &clientpb.Thinned{Bulk: 3}}
		frames := pushFrames(tc.msgs, meta)
		var got []*clientpb.Message
		for i, b := range frames {
			if len(b) > maxPushFrame {
				t.Fatalf("frame of %d bytes", len(b))
			}
			var f clientpb.Frame
			if err := proto.Unmarshal(b, &f); err != nil || !f.GetPush().GetHistory() {
				t.Fatalf("frame does not parse as a history Push: %v", err)
			}
			p := f.GetPush()
			if first, last := i == 0, i == len(frames)-1; (p.Thinned != nil) != first || (p.Recovery != nil) != last {
				t.Fatalf("frame %d of %d: thinned %v, recovery %v; want thinned on the first, recovery on the last", i, len(frames), p.Thinned, p.Recovery)
			}
			got = append(got, p.GetMessages()...)
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
	if pushFrames(nil, pushMeta{}) != nil {
		t.Fatal("frames for no messages")
	}
	frames := pushFrames(nil, pushMeta{history: true, recovery: &clientpb.Recovery{Recovered: true}})
	var f clientpb.Frame
	if len(frames) != 1 || proto.Unmarshal(frames[0], &f) != nil || !f.GetPush().GetRecovery().GetRecovered() {
		t.Fatalf("nothing to recover: %d frames, %v; want one Push with its Recovery", len(frames), &f)
	}
}
