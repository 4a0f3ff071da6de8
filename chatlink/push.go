package chatlink

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/clientpb"
)

// maxPushFrame is the largest frame the node sends: the protocol's frame limit, the same both
// ways (docs/protocol.md; sdk.MaxFrameSize), which clients enforce when they read.
const maxPushFrame = 65536

// pushMeta is what a run of Push frames says besides its messages.
type pushMeta struct {
	history  bool               // on every frame: the messages are history asked for at login
	recovery *clientpb.Recovery // on the last frame: the end of that history
	thinned  *clientpb.Thinned  // on the first frame: messages left out since the previous Push
}

func (m pushMeta) empty() bool { return !m.history && m.recovery == nil && m.thinned == nil }

// pushFrames encodes msgs as Push frames of at most maxPushFrame bytes each, in order: a tick
// of large messages, or a long history, goes out as several frames rather than one a client
// would refuse. A message alone always fits: bodies are limited to 16 KiB. Without messages it
// returns one frame when meta has something to say (nothing to recover, a thinned count), else
// none.
func pushFrames(msgs []*clientpb.Message, meta pushMeta) [][]byte {
	// Frame{push: Push{messages..., meta}}: the two outer headers take at most 1+3 bytes each
	// below the limit, and the meta fields at most 32 (history 2, recovery 2+2+11, thinned
	// 2+6+6).
	const room = maxPushFrame - 2*(1+3) - 32
	if len(msgs) == 0 {
		if meta.empty() {
			return nil
		}
		return [][]byte{encodePush(nil, meta.history, meta.recovery, meta.thinned)}
	}
	var frames [][]byte
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) {
			n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(msgs[end])) // as a field of Push
			if end > start && size+n > room {
				break
			}
			size += n
			end++
		}
		var rec *clientpb.Recovery
		var thinned *clientpb.Thinned
		if start == 0 {
			thinned = meta.thinned
		}
		if end == len(msgs) {
			rec = meta.recovery
		}
		frames = append(frames, encodePush(msgs[start:end], meta.history, rec, thinned))
		start = end
	}
	return frames
}

func encodePush(msgs []*clientpb.Message, history bool, rec *clientpb.Recovery, thinned *clientpb.Thinned) []byte {
	b, _ := proto.Marshal(&clientpb.Frame{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{
		Messages: msgs, History: history, Recovery: rec, Thinned: thinned,
	}}})
	return b
}
